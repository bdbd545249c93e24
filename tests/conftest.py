"""Quiet third-party import-time noise that pytest cannot filter as a warning."""
import logging

# torchao registers an Enum as a pytree constant when imported (the backend suite's conftest
# imports it at collection, outside pytest's capture); torch *logs* its deprecation notice.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)

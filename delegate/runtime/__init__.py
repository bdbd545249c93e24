"""Runtime: the .pte runner and the Python backends it dispatches delegates to.

`Runtime` is imported lazily so that `import delegate.runtime.backends` stays light; nothing
here imports export-time code (partitioner, preprocess).
"""

_LAZY = {"Runtime": "delegate.runtime.program", "Program": "delegate.runtime.program",
         "Method": "delegate.runtime.method"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'delegate.runtime' has no attribute {name!r}")

from executorch.backends.test.suite.operators.test_log10 import *  # noqa: F401,F403

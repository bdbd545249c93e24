from executorch.backends.test.suite.operators.test_log2 import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_log1p import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_log import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_squeeze import *  # noqa: F401,F403

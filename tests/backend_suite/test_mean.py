from executorch.backends.test.suite.operators.test_mean import *  # noqa: F401,F403

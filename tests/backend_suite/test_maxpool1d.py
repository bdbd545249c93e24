from executorch.backends.test.suite.operators.test_maxpool1d import *  # noqa: F401,F403

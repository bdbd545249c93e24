from executorch.backends.test.suite.operators.test_maxpool2d import *  # noqa: F401,F403

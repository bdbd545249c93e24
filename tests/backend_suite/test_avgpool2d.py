from executorch.backends.test.suite.operators.test_avgpool2d import *  # noqa: F401,F403

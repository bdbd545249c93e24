from executorch.backends.test.suite.operators.test_adaptive_avgpool2d import *  # noqa: F401,F403

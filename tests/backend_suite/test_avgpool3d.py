from executorch.backends.test.suite.operators.test_avgpool3d import *  # noqa: F401,F403

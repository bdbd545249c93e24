from executorch.backends.test.suite.operators.test_conv3d import *  # noqa: F401,F403

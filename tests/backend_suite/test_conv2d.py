from executorch.backends.test.suite.operators.test_conv2d import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_conv1d import *  # noqa: F401,F403

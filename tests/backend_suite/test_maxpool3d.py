from executorch.backends.test.suite.operators.test_maxpool3d import *  # noqa: F401,F403

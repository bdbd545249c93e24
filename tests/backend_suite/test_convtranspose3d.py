from executorch.backends.test.suite.operators.test_convtranspose3d import *  # noqa: F401,F403

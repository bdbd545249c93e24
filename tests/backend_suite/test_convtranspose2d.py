from executorch.backends.test.suite.operators.test_convtranspose2d import *  # noqa: F401,F403

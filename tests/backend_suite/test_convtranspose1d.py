from executorch.backends.test.suite.operators.test_convtranspose1d import *  # noqa: F401,F403

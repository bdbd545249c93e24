from executorch.backends.test.suite.operators.test_linear import *  # noqa: F401,F403

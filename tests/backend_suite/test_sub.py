from executorch.backends.test.suite.operators.test_sub import *  # noqa: F401,F403

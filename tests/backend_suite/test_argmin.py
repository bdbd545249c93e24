from executorch.backends.test.suite.operators.test_argmin import *  # noqa: F401,F403

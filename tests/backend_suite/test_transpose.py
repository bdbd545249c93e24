from executorch.backends.test.suite.operators.test_transpose import *  # noqa: F401,F403

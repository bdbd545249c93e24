from executorch.backends.test.suite.operators.test_add import *  # noqa: F401,F403

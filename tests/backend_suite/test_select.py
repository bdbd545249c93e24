from executorch.backends.test.suite.operators.test_select import *  # noqa: F401,F403

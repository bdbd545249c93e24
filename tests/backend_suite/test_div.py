from executorch.backends.test.suite.operators.test_div import *  # noqa: F401,F403

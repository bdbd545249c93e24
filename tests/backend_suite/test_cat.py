from executorch.backends.test.suite.operators.test_cat import *  # noqa: F401,F403

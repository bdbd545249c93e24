from executorch.backends.test.suite.operators.test_neg import *  # noqa: F401,F403

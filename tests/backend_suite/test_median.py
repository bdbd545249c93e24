from executorch.backends.test.suite.operators.test_median import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_exp import *  # noqa: F401,F403

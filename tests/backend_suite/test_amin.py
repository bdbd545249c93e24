from executorch.backends.test.suite.operators.test_amin import *  # noqa: F401,F403

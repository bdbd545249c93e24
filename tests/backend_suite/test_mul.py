from executorch.backends.test.suite.operators.test_mul import *  # noqa: F401,F403

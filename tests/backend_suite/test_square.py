from executorch.backends.test.suite.operators.test_square import *  # noqa: F401,F403

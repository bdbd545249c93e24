from executorch.backends.test.suite.operators.test_floor_divide import *  # noqa: F401,F403

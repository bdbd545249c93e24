from executorch.backends.test.suite.operators.test_floor import *  # noqa: F401,F403

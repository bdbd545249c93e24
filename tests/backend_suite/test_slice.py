from executorch.backends.test.suite.operators.test_slice import *  # noqa: F401,F403

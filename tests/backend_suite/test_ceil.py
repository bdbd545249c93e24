from executorch.backends.test.suite.operators.test_ceil import *  # noqa: F401,F403

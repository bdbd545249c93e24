from executorch.backends.test.suite.operators.test_clamp import *  # noqa: F401,F403

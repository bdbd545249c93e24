from executorch.backends.test.suite.operators.test_rsqrt import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_silu import *  # noqa: F401,F403

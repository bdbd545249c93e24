from executorch.backends.test.suite.operators.test_trunc import *  # noqa: F401,F403

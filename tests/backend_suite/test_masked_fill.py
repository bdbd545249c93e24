from executorch.backends.test.suite.operators.test_masked_fill import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_amax import *  # noqa: F401,F403

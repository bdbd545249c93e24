from executorch.backends.test.suite.operators.test_reshape import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_split import *  # noqa: F401,F403

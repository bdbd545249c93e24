from executorch.backends.test.suite.operators.test_embedding import *  # noqa: F401,F403

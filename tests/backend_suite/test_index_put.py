from executorch.backends.test.suite.operators.test_index_put import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_index_select import *  # noqa: F401,F403

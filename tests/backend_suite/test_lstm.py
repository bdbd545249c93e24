from executorch.backends.test.suite.operators.test_lstm import *  # noqa: F401,F403

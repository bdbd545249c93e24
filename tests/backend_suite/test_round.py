from executorch.backends.test.suite.operators.test_round import *  # noqa: F401,F403

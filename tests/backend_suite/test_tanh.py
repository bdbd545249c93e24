from executorch.backends.test.suite.operators.test_tanh import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_sqrt import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_unsqueeze import *  # noqa: F401,F403

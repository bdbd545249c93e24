from executorch.backends.test.suite.operators.test_argmax import *  # noqa: F401,F403

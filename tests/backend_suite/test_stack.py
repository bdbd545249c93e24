from executorch.backends.test.suite.operators.test_stack import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_relu import *  # noqa: F401,F403

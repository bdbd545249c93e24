from executorch.backends.test.suite.operators.test_leaky_relu import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_glu import *  # noqa: F401,F403

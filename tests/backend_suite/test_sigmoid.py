from executorch.backends.test.suite.operators.test_sigmoid import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_avgpool1d import *  # noqa: F401,F403

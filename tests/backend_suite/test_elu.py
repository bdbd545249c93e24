from executorch.backends.test.suite.operators.test_elu import *  # noqa: F401,F403

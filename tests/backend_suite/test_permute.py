from executorch.backends.test.suite.operators.test_permute import *  # noqa: F401,F403

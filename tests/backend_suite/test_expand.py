from executorch.backends.test.suite.operators.test_expand import *  # noqa: F401,F403

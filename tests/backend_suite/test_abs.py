from executorch.backends.test.suite.operators.test_abs import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_hardswish import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_view import *  # noqa: F401,F403

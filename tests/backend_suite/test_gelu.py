from executorch.backends.test.suite.operators.test_gelu import *  # noqa: F401,F403

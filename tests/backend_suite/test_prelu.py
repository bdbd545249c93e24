from executorch.backends.test.suite.operators.test_prelu import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_threshold import *  # noqa: F401,F403

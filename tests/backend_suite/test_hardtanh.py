from executorch.backends.test.suite.operators.test_hardtanh import *  # noqa: F401,F403

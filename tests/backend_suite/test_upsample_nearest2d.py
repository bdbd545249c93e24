from executorch.backends.test.suite.operators.test_upsample_nearest2d import *  # noqa: F401,F403

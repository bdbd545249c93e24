from executorch.backends.test.suite.operators.test_upsample_bilinear2d import *  # noqa: F401,F403

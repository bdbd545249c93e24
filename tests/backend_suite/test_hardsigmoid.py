from executorch.backends.test.suite.operators.test_hardsigmoid import *  # noqa: F401,F403

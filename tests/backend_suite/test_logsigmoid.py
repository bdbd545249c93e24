from executorch.backends.test.suite.operators.test_logsigmoid import *  # noqa: F401,F403

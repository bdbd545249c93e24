from executorch.backends.test.suite.operators.test_embedding_bag import *  # noqa: F401,F403

from executorch.backends.test.suite.operators.test_pow import *  # noqa: F401,F403

"""The test suite, one package: pytest imports each module once, as tests.<name>, the name
the modules import one another by, so a module-level cache (tests/once.py) is one cache."""

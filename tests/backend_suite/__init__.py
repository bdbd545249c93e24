"""ExecuTorch's backend operator test suite, run against etwgpu (see conftest.py)."""

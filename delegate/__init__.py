"""etwgpu: an ExecuTorch backend delegate in Python.

Export-time names (WgpuPartitioner, WgpuBackend) are imported lazily so that loading and running
a .pte (delegate.runtime) never imports the partitioner or preprocess code.
"""
from delegate.errors import (  # noqa: F401
    BackendNotFoundError,
    BlobError,
    DelegateError,
    DeviceError,
    InputError,
    KernelError,
    ProgramError,
    ResourceError,
    ShaderError,
    UnknownOperatorError,
    UnsupportedError,
)

_LAZY = {
    "WgpuPartitioner": "delegate.partitioner",
    "WgpuBackend": "delegate.preprocess",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'delegate' has no attribute {name!r}")

"""Typed errors. Every error our code raises derives from DelegateError and says what was
expected and what came."""


class DelegateError(Exception):
    """Base of every error raised by etwgpu."""


class ProgramError(DelegateError):
    """A .pte file is truncated, corrupted, or uses something the runner cannot interpret."""


class BlobError(DelegateError):
    """A delegate blob is corrupted: bad magic, unknown schema version, out-of-range ids."""


class InputError(DelegateError):
    """Inputs given to execute() do not match the method: count, dtype, rank, shape or bounds."""


class BackendNotFoundError(DelegateError):
    """A DelegateCall names a backend id that no registered Python backend provides."""


class UnknownOperatorError(DelegateError):
    """An operator name is neither in our op registry nor resolvable as an ATen/ExecuTorch op."""


class UnsupportedError(DelegateError):
    """A construct is valid ExecuTorch but outside what this delegate implements."""


class ResourceError(DelegateError):
    """A load needs more memory (host or device) than can be had."""


class KernelError(DelegateError):
    """A kernel raised while running a node; the message names the node, its op and source."""


class DeviceError(DelegateError):
    """The requested device cannot be used (for example no WebGPU adapter exists)."""


class ShaderError(DeviceError):
    """A WGSL shader or pipeline failed validation; carries the driver's message."""


def expect(cond: bool, exc: type[DelegateError], what: str, expected, got) -> None:
    """Raise `exc` saying what was expected and what came, unless cond holds."""
    if not cond:
        raise exc(f"{what}: expected {expected}, got {got}")

"""CPU kernels: torch ops on one process-wide thread pool.

A kernel registers under the same name as its op in delegate/ops. It is a function of tensors:

    kernel(ins: list[Tensor | None], outs: list[Tensor], attrs: dict, scratch: Tensor | None)

`outs` are preallocated at the live output shapes (views into the executor's per-load arena)
and the kernel writes them. `scratch` is a uint8 view of the per-load scratch arena of at least
`scratch_nbytes(in_shapes, attrs, num_workers)` bytes; kernels split it into disjoint
per-worker slices. Kernels know nothing of the IR, the partitioner, or each other.

Third parties add kernels through the `etwgpu.kernels` entry-point group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from delegate.errors import UnknownOperatorError
from delegate.plugins import import_families

KernelFn = Callable[[list, list, dict, object], None]
ScratchFn = Callable[[list, dict, int], int]


@dataclass(frozen=True)
class CpuKernel:
    name: str
    fn: KernelFn
    scratch_nbytes: Optional[ScratchFn] = None


_KERNELS: dict[str, CpuKernel] = {}
_loaded = False


def register_kernel(name: str, scratch_nbytes: Optional[ScratchFn] = None):
    """Decorator: register `fn` as the CPU kernel of op `name`."""

    def deco(fn: KernelFn) -> KernelFn:
        _KERNELS[name] = CpuKernel(name, fn, scratch_nbytes)
        return fn

    return deco


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import_families(__name__, __path__, skip=("threadpool",), group="etwgpu.kernels")


def has_kernel(name: str) -> bool:
    _load()
    return name in _KERNELS


def get_kernel(name: str) -> CpuKernel:
    _load()
    try:
        return _KERNELS[name]
    except KeyError:
        raise UnknownOperatorError(
            f"CPU kernel {name!r}: expected a registered kernel, got none under that name"
        ) from None

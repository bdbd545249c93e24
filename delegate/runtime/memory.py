"""Tensor storage for the .pte runner: planned arenas, constants and capacity-bounded slots.

Every planned tensor is a view into its arena at the planner's offset, so values the emitter
aliased (an elided static view shares its base's offset) really share memory. Each view gets
its own *non-resizable* storage covering exactly its planned bytes: an ATen `.out` kernel may
shrink or regrow its out tensor within that capacity, and a result that needs more raises
instead of spilling into the neighbouring tensor (see `CAPACITY_MARK`).
"""
from __future__ import annotations

import numpy as np
import torch

from delegate.errors import ProgramError, ResourceError, UnsupportedError
from delegate.shape_math import numel

# ExecuTorch ScalarType (schema/scalar_type.fbs, same numbering as c10) -> torch dtype.
_DTYPES = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64,
    5: torch.float16, 6: torch.float32, 7: torch.float64, 8: torch.complex32,
    9: torch.complex64, 10: torch.complex128, 11: torch.bool, 15: torch.bfloat16,
    23: torch.float8_e5m2, 24: torch.float8_e4m3fn, 25: torch.float8_e5m2fnuz,
    26: torch.float8_e4m3fnuz, 27: torch.uint16, 28: torch.uint32, 29: torch.uint64,
}

# The message torch raises when a kernel resizes an out tensor past its storage.
CAPACITY_MARK = "not resizable"

STATIC, DYNAMIC_BOUND, DYNAMIC_UNBOUND = 0, 1, 2
EXTERNAL = 1  # TensorDataLocation.EXTERNAL


def torch_dtype(scalar_type) -> torch.dtype:
    code = int(scalar_type)
    if code not in _DTYPES:
        raise UnsupportedError(
            f"tensor scalar type: expected one of {sorted(_DTYPES)}, got {code}")
    return _DTYPES[code]


def dim_order_strides(sizes: list[int], dim_order: list[int]) -> list[int]:
    """Strides of a dense tensor whose dims are laid out outer-to-inner in `dim_order`."""
    rank = len(sizes)
    if not dim_order:  # older programs leave it empty for contiguous tensors
        dim_order = list(range(rank))
    if sorted(dim_order) != list(range(rank)):
        raise UnsupportedError(
            f"dim_order: expected a permutation of range({rank}), got {list(dim_order)}")
    strides = [0] * rank
    step = 1
    for d in reversed(dim_order):
        strides[d] = step
        step *= max(int(sizes[d]), 1)
    return strides


def nbytes_of(sizes: list[int], dtype: torch.dtype) -> int:
    return numel(sizes) * dtype.itemsize


class Arena:
    """One zero-filled byte buffer per memory id of `non_const_buffer_sizes`.

    Index 0 is reserved by ExecuTorch (the constant area), so it is never allocated.
    """

    def __init__(self, sizes: list[int]):
        self.buffers: dict[int, np.ndarray] = {}
        for mem_id, size in enumerate(sizes):
            if mem_id == 0:
                continue
            if size < 0:
                raise ProgramError(f"arena {mem_id} size: expected >= 0, got {size}")
            self.buffers[mem_id] = np.zeros(int(size), dtype=np.uint8)

    def region(self, mem_id: int, offset: int, nbytes: int) -> np.ndarray:
        buf = self.buffers.get(mem_id)
        if buf is None:
            raise ProgramError(
                f"allocation memory_id: expected one of {sorted(self.buffers)}, got {mem_id}")
        if offset < 0 or offset + nbytes > buf.size:
            raise ProgramError(
                f"allocation in arena {mem_id}: expected [offset, offset+nbytes) within "
                f"{buf.size} bytes, got [{offset}, {offset + nbytes})")
        return buf[offset:offset + nbytes]


def tensor_over(region: np.ndarray, dtype: torch.dtype, sizes, strides) -> torch.Tensor:
    """A tensor over `region`'s bytes whose storage is exactly that region (non-resizable)."""
    flat = torch.from_numpy(region)
    if dtype != torch.uint8:
        flat = flat.view(dtype)
    return flat.as_strided(list(sizes), list(strides))


def owned_region(nbytes: int) -> np.ndarray:
    """Bounded storage for a tensor that has no planned slot (e.g. unplanned inputs)."""
    return np.zeros(nbytes, dtype=np.uint8)


def writable_bytes(data) -> np.ndarray:
    """Copy serialized bytes once into a writable array (torch refuses read-only buffers)."""
    return np.frombuffer(bytes(data), dtype=np.uint8).copy()


def allocate(nbytes: int, what: str) -> torch.Tensor:
    """A uint8 buffer of nbytes; a failed allocation is a typed error, not torch's."""
    try:
        return torch.empty(int(nbytes), dtype=torch.uint8)
    except RuntimeError as e:   # "can't allocate memory": the blob asks for more than there is
        raise ResourceError(f"{what}: expected {nbytes} bytes of host memory, got an "
                            f"allocation failure ({e})") from None

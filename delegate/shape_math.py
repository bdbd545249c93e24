"""Shape arithmetic shared by the op registry, the executors and the kernels: torch's dim
wrapping and slice clamping, element counts. Imports nothing of ours but the errors, so a
kernel can use it without knowing the registry or the IR."""
from __future__ import annotations

import math

from delegate.errors import DelegateError, expect

_INT_MAX = 2 ** 63 - 1
SDPA_READ_DIMS = ("q_dims", "k_dims", "v_dims")   # sdpa's layouts of inputs 0, 1 and 2


def numel(shape) -> int:
    return math.prod(int(s) for s in shape)


def norm_dim(d: int, ndim: int, what: str = "dim", scalar_ok: bool = False) -> int:
    """Torch's dim wrapping; with scalar_ok a 0-d tensor accepts dims 0 and -1 (softmax,
    squeeze), otherwise indexing a dim needs rank >= 1."""
    expect(ndim >= 1 or scalar_ok, DelegateError, what, "a tensor of rank >= 1", "rank 0")
    n = max(ndim, 1)
    expect(-n <= d < n, DelegateError, what, f"a dim in [{-n}, {n})", d)
    return d % n


def slice_bounds(size: int, start, end, step: int) -> tuple:
    """Torch's clamping: None and huge sentinels mean the edge; negatives count from the end."""
    start = 0 if start is None else start
    end = size if end is None or end >= _INT_MAX else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, step


def index_block_start(indexed: list) -> int:
    """Where advanced indexing (x[i, :, j]) puts the dims of its broadcast index tensors among
    the dims it keeps: at the first indexed dim when the indexed dims are adjacent, else in
    front (numpy's rule, which torch follows). `indexed`: the indexed dims, ascending."""
    adjacent = indexed == list(range(indexed[0], indexed[0] + len(indexed)))
    return indexed[0] if adjacent else 0


def sdpa_read_shapes(in_shapes, attrs) -> tuple:
    """q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev] as sdpa's kernels read them:
    inputs 0, 1 and 2 through q_dims, k_dims and v_dims (empty: as stored)."""
    return tuple(tuple(s[i] for i in attrs.get(key) or range(len(s)))
                 for s, key in zip(in_shapes[:3], SDPA_READ_DIMS))

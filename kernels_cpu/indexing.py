"""Index CPU kernel (delegate/ops/indexing.py): advanced indexing through torch's
index.Tensor_out, after a range check that makes a bad index an InputError rather than a
crash inside torch. A large gather is split along output dim 0 across the pool."""
from __future__ import annotations

import torch

from delegate.errors import InputError
from delegate.shape_math import index_block_start
from kernels_cpu import register_kernel
from kernels_cpu.elementwise import PARALLEL_NUMEL
from kernels_cpu.threadpool import get_pool

aten = torch.ops.aten


def _check_range(index: torch.Tensor, size: int, dim: int, wrap: bool) -> None:
    """A negative index counts from the end only with wrap (index_select refuses one)."""
    low = -size if wrap else 0
    if index.numel():
        lo, hi = (int(v) for v in torch.aminmax(index))
        if lo < low or hi >= size:
            bad = lo if lo < low else hi
            raise InputError(f"index into dim {dim}: expected in [{low}, {size}), got {bad}")


@register_kernel("index")
def index(ins, outs, attrs, scratch):
    x, indices, out = ins[0], list(ins[1:]), outs[0]
    for d, i in enumerate(indices):
        if i is not None:
            _check_range(i, x.shape[d], d, attrs["wrap"])
    pool = get_pool()
    if out.numel() < PARALLEL_NUMEL or pool.num_threads == 1 or out.dim() == 0 or \
            out.shape[0] < 2:
        aten.index.Tensor_out(x, indices, out=out)
        return
    pool.parallel_for(out.shape[0], lambda _w, a, b: _gather_rows(x, indices, out, a, b),
                      min_chunk=max(1, (PARALLEL_NUMEL // 2) // (out.numel() // out.shape[0])))


def _gather_rows(x, indices, out, a: int, b: int) -> None:
    """Rows [a, b) of output dim 0: a dim of x taken whole, or the index block's first dim."""
    indexed = [d for d, i in enumerate(indices) if i is not None]
    if index_block_start(indexed) > 0:   # out dim 0 is x's dim 0
        aten.index.Tensor_out(x.narrow(0, a, b - a), indices, out=out.narrow(0, a, b - a))
        return
    block = torch.broadcast_shapes(*(indices[d].shape for d in indexed))
    if not block:   # 0-d indices: out dim 0 is the first dim x keeps
        kept = next(d for d in range(x.dim()) if d not in indexed)
        aten.index.Tensor_out(x.narrow(kept, a, b - a), indices, out=out.narrow(0, a, b - a))
        return
    rows = [None if i is None else i.expand(block).narrow(0, a, b - a) for i in indices]
    aten.index.Tensor_out(x, rows, out=out.narrow(0, a, b - a))

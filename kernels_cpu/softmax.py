"""Softmax CPU kernel: x viewed as [outer, K, inner], softmax over K, blocks of the outer rows
(or, when there are too few, of the inner columns) split across the pool.

    y = exp(x - max_K x) / sum_K exp(x - max_K x)
"""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel
from kernels_cpu.threadpool import get_pool

aten = torch.ops.aten

# A block below this many elements is not worth a pool dispatch.
PARALLEL_NUMEL = 1 << 16


@register_kernel("softmax")
def softmax(ins, outs, attrs, scratch):
    x, out = ins[0], outs[0]
    if x.dim() == 0:
        out.fill_(1.0)
        return
    d = attrs["dim"] % x.dim()
    k = x.shape[d]
    outer = x.shape[:d].numel()
    inner = x.shape[d + 1:].numel()
    # a last-dim softmax must stay 2-D: [outer, K, 1] takes torch's strided path, ~15x slower
    view = (outer, k) if inner == 1 else (outer, k, inner)
    x3, o3 = x.reshape(view), out.view(view)
    pool = get_pool()
    few_rows = outer < pool.num_threads
    if pool.num_threads == 1 or x.numel() < 2 * PARALLEL_NUMEL or (few_rows and inner == 1):
        aten._softmax.out(x3, 1, False, out=o3)
    elif not few_rows:
        min_chunk = max(1, PARALLEL_NUMEL // max(k * inner, 1))
        pool.parallel_for(outer, lambda _w, a, b: aten._softmax.out(
            x3[a:b], 1, False, out=o3[a:b]), min_chunk=min_chunk)
    else:
        # _softmax.out silently writes garbage into a non-contiguous out (torch 2.13), so a
        # column block goes through a temporary; transformers never take this path
        pool.parallel_for(inner, lambda _w, a, b: o3[:, :, a:b].copy_(
            aten._softmax(x3[:, :, a:b], 1, False)))

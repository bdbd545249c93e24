"""Normalization CPU kernels over the trailing normalized dims, rows split across the pool.

    rms_norm:   y = x * rsqrt(mean(x^2) + eps) * w
    layer_norm: y = (x - mean) * rsqrt(var + eps) * w + b      (biased variance)
"""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel
from kernels_cpu.threadpool import get_pool

aten = torch.ops.aten

# A row block below this many elements is not worth a pool dispatch.
PARALLEL_NUMEL = 1 << 16


def _rows(x: torch.Tensor, normalized_shape) -> tuple:
    """x as [rows, K] where K is the product of the normalized dims."""
    k = 1
    for s in normalized_shape:
        k *= int(s)
    return x.reshape(-1, k), k


def _for_rows(rows: int, k: int, fn) -> None:
    pool = get_pool()
    min_chunk = max(1, PARALLEL_NUMEL // max(k, 1))
    if pool.num_threads == 1 or rows < 2 * min_chunk:
        fn(0, 0, rows)
    else:
        pool.parallel_for(rows, fn, min_chunk=min_chunk)


@register_kernel("rms_norm")
def rms_norm(ins, outs, attrs, scratch):
    x, k = _rows(ins[0], attrs["normalized_shape"])
    w = ins[1].reshape(k) if len(ins) > 1 and ins[1] is not None else None
    out = outs[0].view(-1, k)
    eps = attrs.get("eps")
    eps = torch.finfo(torch.float32).eps if eps is None else eps

    def work(_w, r0, r1):
        xs, o = x[r0:r1], out[r0:r1]
        torch.mul(xs, xs, out=o)                     # squares staged in the output, no temp
        inv = o.mean(dim=1, keepdim=True).add_(eps).rsqrt_()
        torch.mul(xs, inv, out=o)
        if w is not None:
            o.mul_(w)

    _for_rows(x.shape[0], k, work)


@register_kernel("layer_norm")
def layer_norm(ins, outs, attrs, scratch):
    shape = [int(s) for s in attrs["normalized_shape"]]
    x, k = _rows(ins[0], shape)
    w, b = ins[1], ins[2]
    w = None if w is None else w.reshape(k)
    b = None if b is None else b.reshape(k)
    out = outs[0].view(-1, k)
    rows = x.shape[0]
    # mean / rstd go to the node's outputs when it has them, else to small per-call buffers
    stats = [o.view(rows, 1) for o in outs[1:3]] if len(outs) == 3 else [
        torch.empty(rows, 1), torch.empty(rows, 1)]
    eps = float(attrs["eps"])

    def work(_w, r0, r1):
        aten.native_layer_norm.out(x[r0:r1], [k], w, b, eps, out0=out[r0:r1],
                                   out1=stats[0][r0:r1], out2=stats[1][r0:r1])

    _for_rows(rows, k, work)

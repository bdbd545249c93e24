"""Matrix-product CPU kernels: linear, mm, bmm, addmm; convolution.

Every product is out[M, N] = beta * bias + alpha * (a[M, K] @ b[K, N]). When M is large enough
to share (prefill), BLAS itself runs on the pool's core count (torch_threads); for a GEMV
(decode: M == 1) workers take disjoint column blocks, each calling torch on its slice with out=
views.
"""
from __future__ import annotations

from typing import Optional

import torch

from kernels_cpu import register_kernel
from kernels_cpu.threadpool import get_pool, torch_threads

# Below this many multiply-adds (~100 us on one core) the pool's dispatch costs more than it saves.
PARALLEL_MACS = 1 << 20
# Column blocks narrower than this lose the GEMM's vectorisation.
MIN_COLS = 64


def _product(o, a, b, bias, alpha: float, beta: float) -> None:
    if bias is None:
        torch.mm(a, b, out=o)
        if alpha != 1.0:
            o.mul_(alpha)
    else:
        torch.addmm(bias, a, b, beta=beta, alpha=alpha, out=o)


def gemm(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
         bias: Optional[torch.Tensor] = None, alpha: float = 1.0, beta: float = 1.0) -> None:
    """out = beta * bias + alpha * a @ b on the pool; b may be a transposed view."""
    M, K = a.shape
    N = b.shape[1]
    if bias is not None:
        bias = bias.expand(M, N)
    pool = get_pool()
    workers = pool.num_threads
    if workers == 1 or M * N * K < PARALLEL_MACS:
        _product(out, a, b, bias, alpha, beta)
    elif M >= workers:
        with torch_threads(workers):
            _product(out, a, b, bias, alpha, beta)
    else:
        def cols(_w, c0, c1):
            _product(out[:, c0:c1], a, b[:, c0:c1], None if bias is None else bias[:, c0:c1],
                     alpha, beta)
        pool.parallel_for(N, cols, min_chunk=MIN_COLS)


@register_kernel("linear")
def linear(ins, outs, attrs, scratch):
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    K, N = w.shape[1], w.shape[0]
    gemm(outs[0].view(-1, N), x.reshape(-1, K), w.t(), bias)


@register_kernel("mm")
def mm(ins, outs, attrs, scratch):
    gemm(outs[0], ins[0], ins[1])


@register_kernel("addmm")
def addmm(ins, outs, attrs, scratch):
    gemm(outs[0], ins[1], ins[2], ins[0], attrs.get("alpha", 1.0), attrs.get("beta", 1.0))


@register_kernel("bmm")
def bmm(ins, outs, attrs, scratch):
    a, b, out = ins[0], ins[1], outs[0]
    B, M, K = a.shape
    N = b.shape[2]
    pool = get_pool()
    if pool.num_threads == 1 or B * M * N * K < PARALLEL_MACS:
        torch.bmm(a, b, out=out)
    elif B >= pool.num_threads:
        pool.parallel_for(B, lambda _w, s, e: torch.bmm(a[s:e], b[s:e], out=out[s:e]))
    else:
        pool.parallel_for(M, lambda _w, s, e: torch.bmm(a[:, s:e], b, out=out[:, s:e]))


@register_kernel("convolution")
def convolution(ins, outs, attrs, scratch):
    x, w, bias, out = ins[0], ins[1], ins[2] if len(ins) > 2 else None, outs[0]
    args = [attrs[k] for k in ("stride", "padding", "dilation", "transposed", "output_padding",
                               "groups")]

    def conv(o, xs):
        torch.ops.aten.convolution.out(xs, w, bias, *args, out=o)

    pool = get_pool()
    if pool.num_threads == 1 or x.shape[0] == 1:
        conv(out, x)
    else:  # batch elements are independent
        pool.parallel_for(x.shape[0], lambda _w, s, e: conv(out[s:e], x[s:e]))

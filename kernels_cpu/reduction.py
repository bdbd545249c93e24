"""Reduction CPU kernels: sum, mean, amax, amin, var over any dims, argmax, argmin and median,
through torch's out= ops.

When dim 0 is kept and large enough, blocks of it are split across the pool (the RMSNorm
mean over the last dim of [rows, C] is the common case); otherwise one call.
"""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel
from kernels_cpu.threadpool import get_pool

# A block below this many input elements is not worth a pool dispatch.
PARALLEL_NUMEL = 1 << 16


def _dims(attrs, rank: int) -> list:
    """[] means all dims, as torch reads it; explicit so torch.var sees the same set."""
    return [d % rank for d in attrs["dims"]] if attrs["dims"] else list(range(rank))


def _reduce(fn):
    def kernel(ins, outs, attrs, scratch):
        x, out = ins[0], outs[0]
        if x.dim() == 0:    # nothing to reduce: torch gives the value (var: nan, dof <= 0)
            fn(x.reshape(1), [0], False, attrs, out)
            return
        dims, keep = _dims(attrs, x.dim()), attrs["keepdim"]
        pool = get_pool()
        rows = x.shape[0]
        if 0 in dims or pool.num_threads == 1 or x.numel() < 2 * PARALLEL_NUMEL or rows < 2:
            fn(x, dims, keep, attrs, out)
            return
        min_chunk = max(1, PARALLEL_NUMEL // max(x[0].numel(), 1))
        pool.parallel_for(rows, lambda _w, a, b: fn(x[a:b], dims, keep, attrs, out[a:b]),
                          min_chunk=min_chunk)

    return kernel


def _sum(x, dims, keep, attrs, out):
    torch.sum(x, dims, keep, out=out)


def _mean(x, dims, keep, attrs, out):
    torch.mean(x, dims, keep, out=out)


def _amax(x, dims, keep, attrs, out):
    torch.amax(x, dims, keep, out=out)


def _amin(x, dims, keep, attrs, out):
    torch.amin(x, dims, keep, out=out)


def _var(x, dims, keep, attrs, out):
    torch.var(x, dims, correction=attrs["correction"], keepdim=keep, out=out)


def _arg(fn):
    """argmax / argmin over one dim, or over the flattened input (dims [] or every dim)."""
    def run(x, dims, keep, attrs, out):
        if len(dims) == 1:
            fn(x, dims[0], keep, out=out)
        else:
            fn(x.reshape(-1), 0, False, out=out.view(()))

    return run


for _name, _fn in (("sum", _sum), ("mean", _mean), ("amax", _amax), ("amin", _amin),
                   ("var", _var), ("argmax", _arg(torch.argmax)), ("argmin", _arg(torch.argmin))):
    register_kernel(_name)(_reduce(_fn))


@register_kernel("median")
def median(ins, outs, attrs, scratch):
    x, dims, keep = ins[0], attrs["dims"], attrs["keepdim"]
    if not dims or x.dim() == 0:   # every dim: the flattened input's (value, index)
        for out, r in zip(outs, torch.median(x.reshape(-1), 0)):
            out.view(()).copy_(r)
    elif len(outs) > 1:
        torch.median(x, dims[0], keep, out=(outs[0], outs[1]))
    else:
        outs[0].copy_(torch.median(x, dims[0], keep).values)

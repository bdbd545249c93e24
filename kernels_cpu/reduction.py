"""Reduction CPU kernels: sum, mean, amax, amin, var over any dims, through torch's out= ops.

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


for _name, _fn in (("sum", _sum), ("mean", _mean), ("amax", _amax), ("amin", _amin),
                   ("var", _var)):
    register_kernel(_name)(_reduce(_fn))

"""Creation CPU kernels (delegate/ops/creation.py): arange, full, cumsum, triu and tril, through
torch's out= ops. cumsum, triu and tril split independent rows across the pool when large."""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel
from kernels_cpu.elementwise import PARALLEL_NUMEL
from kernels_cpu.threadpool import get_pool


def _dtype(attrs) -> torch.dtype:
    return getattr(torch, attrs["dtype"])


@register_kernel("arange")
def arange(ins, outs, attrs, scratch):
    # torch computes float values as start + i * step in double, as the op defines them
    torch.arange(attrs["start"], attrs["end"], attrs["step"], dtype=_dtype(attrs), out=outs[0])


@register_kernel("full")
def full(ins, outs, attrs, scratch):
    outs[0].fill_(attrs["value"])


def _split_rows(out: torch.Tensor, dims: list, fn) -> None:
    """fn(d, a, b) over ranges [a, b) of the first of `dims` (dims whose slices are
    independent) longer than 1, in parallel when out is large; fn(None, None, None) in one
    call otherwise."""
    pool = get_pool()
    dims = [d for d in dims if out.shape[d] > 1]
    if not dims or out.numel() < PARALLEL_NUMEL or pool.num_threads == 1:
        fn(None, None, None)
        return
    d = dims[0]
    row = out.numel() // out.shape[d]
    pool.parallel_for(out.shape[d], lambda _w, a, b: fn(d, a, b),
                      min_chunk=max(1, (PARALLEL_NUMEL // 2) // row))


def _narrow(t: torch.Tensor, d, a, b) -> torch.Tensor:
    return t if d is None else t.narrow(d, a, b - a)


@register_kernel("cumsum")
def cumsum(ins, outs, attrs, scratch):
    x, out = ins[0], outs[0]
    if x.dim() == 0:
        torch.cumsum(x, 0, dtype=out.dtype, out=out)
        return
    dim = attrs["dim"] % x.dim()
    others = [d for d in range(x.dim()) if d != dim]
    _split_rows(out, others, lambda d, a, b: torch.cumsum(_narrow(x, d, a, b), dim, dtype=out.dtype,
                                                       out=_narrow(out, d, a, b)))


def _triangle(torch_fn):
    def kernel(ins, outs, attrs, scratch):
        x, out = ins[0], outs[0]
        # matrices are independent; the rows of one are not (the diagonal counts from row 0)
        lead = x.reshape(-1, *x.shape[-2:])
        flat = out.view(-1, *out.shape[-2:])
        _split_rows(flat, [0], lambda d, a, b: torch_fn(_narrow(lead, d, a, b), attrs["diagonal"],
                                                      out=_narrow(flat, d, a, b)))

    return kernel


register_kernel("triu")(_triangle(torch.triu))
register_kernel("tril")(_triangle(torch.tril))

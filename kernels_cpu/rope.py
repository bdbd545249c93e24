"""Rotary embedding (delegate/ops/rope.py) on the pool: torch out= ops on pair views.

The rotated channels x[..., :R] are viewed with a pair axis, lead + (R/2, 2) interleaved or
lead + (2, R/2) half, so member a and member b of every pair are two strided views; a table
is viewed and expanded (never copied) to that same shape. Then

    out_a = x_a cos_a - x_b sin_a,   out_b = x_b cos_b + x_a sin_b

as one mul and one addcmul each: the roundings of the unfused mul, mul, sub (add). Channels
past R are copied. Large tensors split along a leading dim, never the pair axis. rope_pair
runs rope on each of its two tensors with the shared tables: the same ops, so the same bits.
rope_cache runs rope on q, rope on k with its cache rows (viewed in k's layout) as the
output, and v's slice_scatter_: the same ops again, with no k' in between.
"""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel
from kernels_cpu.shape import slice_scatter_
from kernels_cpu.threadpool import get_pool

# Below this many elements (1 MiB of float32) a pool dispatch costs more than it saves.
PARALLEL_NUMEL = 1 << 18


def _pairs(t: torch.Tensor, style: str, half: int) -> torch.Tensor:
    """t's last dim (R channels) as a pair axis: (R/2, 2) interleaved, (2, R/2) half."""
    return t.unflatten(-1, (half, 2) if style == "interleaved" else (2, half))


def _table(t: torch.Tensor, style: str, half: int, shape) -> torch.Tensor:
    """A table of R/2 angles (one per pair) or of R (one per channel), expanded to shape."""
    if t.shape[-1] == half:
        t = t.unsqueeze(-1 if style == "interleaved" else -2)
    else:
        t = _pairs(t, style, half)
    return t.expand(shape)


def _rows(out, x, cos, sin, style: str, rd: int) -> None:
    """One chunk of leading rows: rotate the first rd channels, copy the rest."""
    axis, half = (-1 if style == "interleaved" else -2), rd // 2
    o_a, o_b = _pairs(out[..., :rd], style, half).unbind(axis)
    x_a, x_b = _pairs(x[..., :rd], style, half).unbind(axis)
    c_a, c_b = cos.unbind(axis)
    s_a, s_b = sin.unbind(axis)
    torch.mul(x_a, c_a, out=o_a)
    o_a.addcmul_(x_b, s_a, value=-1.0)
    torch.mul(x_b, c_b, out=o_b)
    o_b.addcmul_(x_a, s_b)
    if rd < x.shape[-1]:
        out[..., rd:].copy_(x[..., rd:])


@register_kernel("rope")
def rope(ins, outs, attrs, scratch):
    x, cos, sin = ins[:3]
    out, style, rd = outs[0], attrs["style"], attrs["rotary_dim"]
    half = rd // 2
    shape = tuple(x.shape[:-1]) + ((half, 2) if style == "interleaved" else (2, half))
    cos, sin = _table(cos, style, half, shape), _table(sin, style, half, shape)
    pool, lead = get_pool(), x.shape[:-1]
    if x.numel() < PARALLEL_NUMEL or pool.num_threads == 1 or not lead:
        _rows(out, x, cos, sin, style, rd)
        return
    d = next((i for i, s in enumerate(lead) if s >= pool.num_threads),
             max(range(len(lead)), key=lambda i: lead[i]))
    row = x.numel() // lead[d]

    def work(_w, a, b):
        _rows(*(t.narrow(d, a, b - a) for t in (out, x, cos, sin)), style, rd)

    pool.parallel_for(lead[d], work, min_chunk=max(1, (PARALLEL_NUMEL // 2) // max(row, 1)))


@register_kernel("rope_pair")
def rope_pair(ins, outs, attrs, scratch):
    q, k, cos, sin = ins[:4]
    rope([q, cos, sin], [outs[0]], attrs, scratch)
    rope([k, cos, sin], [outs[1]], attrs, scratch)


@register_kernel("rope_cache")
def rope_cache(ins, outs, attrs, scratch):
    """outs[0] is ins[0]'s storage and ins[2] is written in place too (slice_scatter_pair's
    operands); the source named by attrs["rotated"] is rotated into its cache rows."""
    writes = [(outs[0], ins[1], attrs["src_dims"]), (ins[2], ins[3], attrs["src_dims1"])]
    for j, (cache, src, dims) in enumerate(writes):
        if j != attrs["rotated"]:
            slice_scatter_([cache, src], [cache], {**attrs, "src_dims": dims}, scratch)
            continue
        dims = dims or list(range(src.dim()))
        d = attrs["dim"] % cache.dim()
        rows = cache.narrow(d, attrs["start"], src.shape[dims[d]])
        inverse = sorted(range(len(dims)), key=dims.__getitem__)
        rope([src, ins[5], ins[6]], [rows.permute(*inverse)], attrs, scratch)
    rope([ins[4], ins[5], ins[6]], [outs[1]], attrs, scratch)

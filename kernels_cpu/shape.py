"""Shape CPU kernels. Each is one strided copy from a view of the input into the contiguous
output; large copies split across the pool like elementwise ops."""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel
from kernels_cpu.elementwise import map_chunks


def _copy(out: torch.Tensor, src: torch.Tensor) -> None:
    map_chunks(lambda o, s: o.copy_(s), out, src)


def _reshaped(ins, outs, attrs, scratch):
    # the input is contiguous, so any same-numel reshape is a view
    _copy(outs[0], ins[0].reshape(outs[0].shape))


for _name in ("view", "unsqueeze", "squeeze", "clone"):
    register_kernel(_name)(_reshaped)


@register_kernel("expand")
def expand(ins, outs, attrs, scratch):
    _copy(outs[0], ins[0].expand(outs[0].shape))


@register_kernel("cast")
def cast(ins, outs, attrs, scratch):
    _copy(outs[0], ins[0])   # copy_ converts to the output's dtype, as .to() does


@register_kernel("copy")
def copy(ins, outs, attrs, scratch):
    _copy(outs[0], ins[1])   # src broadcast to dst's shape and converted to its dtype


@register_kernel("permute")
def permute(ins, outs, attrs, scratch):
    _copy(outs[0], ins[0].permute(*attrs["dims"]))


@register_kernel("slice")
def slice_(ins, outs, attrs, scratch):
    x, d = ins[0], attrs["dim"] % max(ins[0].dim(), 1)
    # python slicing clamps start / end exactly as aten.slice does
    index = (slice(None),) * d + (slice(attrs["start"], attrs["end"], attrs["step"]),)
    _copy(outs[0], x[index])


@register_kernel("select")
def select(ins, outs, attrs, scratch):
    _copy(outs[0], ins[0].select(attrs["dim"], attrs["index"]))


@register_kernel("cat")
def cat(ins, outs, attrs, scratch):
    torch.cat([t for t in ins if t is not None], dim=attrs["dim"], out=outs[0])


@register_kernel("split")
def split(ins, outs, attrs, scratch):
    pieces = torch.split(ins[0], [int(s) for s in attrs["split_sizes"]], dim=attrs["dim"])
    for out, piece in zip(outs, pieces):
        _copy(out, piece)


@register_kernel("slice_scatter")
def slice_scatter(ins, outs, attrs, scratch):
    _copy(outs[0], ins[0])
    slice_scatter_(ins, outs, attrs, scratch)


@register_kernel("slice_scatter_")
def slice_scatter_(ins, outs, attrs, scratch):
    """Only the written rows move: outs[0] is ins[0]'s own storage (a resident cache)."""
    src, d = ins[1], attrs["dim"]
    if attrs.get("src_dims"):
        src = src.permute(*attrs["src_dims"])
    outs[0].narrow(d, attrs["start"], src.shape[d]).copy_(src)


@register_kernel("slice_scatter_pair")
def slice_scatter_pair(ins, outs, attrs, scratch):
    """Two slice_scatter_ writes at one position: outs[0] is ins[0]'s storage, and ins[2] (the
    other resident cache) is written in place as well."""
    slice_scatter_(ins[:2], outs, attrs, scratch)
    slice_scatter_(ins[2:4], [ins[2]], {**attrs, "src_dims": attrs["src_dims1"]}, scratch)

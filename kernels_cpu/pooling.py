"""Pooling and upsampling CPU kernels through torch's ATen ops (planes are independent and
ATen already loops them; these ops are a small share of a vision model's time)."""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel

aten = torch.ops.aten


@register_kernel("max_pool2d")
def max_pool2d(ins, outs, attrs, scratch):
    # ATen's out= form also wants the int64 indices no one reads: a plain call and a copy
    outs[0].copy_(aten.max_pool2d_with_indices(
        ins[0], attrs["kernel_size"], attrs["stride"], attrs["padding"], attrs["dilation"],
        attrs["ceil_mode"])[0])


@register_kernel("avg_pool2d")
def avg_pool2d(ins, outs, attrs, scratch):
    aten.avg_pool2d.out(ins[0], attrs["kernel_size"], attrs["stride"], attrs["padding"],
                        attrs["ceil_mode"], attrs["count_include_pad"], None, out=outs[0])


@register_kernel("adaptive_avg_pool2d")
def adaptive_avg_pool2d(ins, outs, attrs, scratch):
    aten.adaptive_avg_pool2d.out(ins[0], attrs["output_size"], out=outs[0])


def _scales(attrs) -> tuple:
    s = attrs["scales"]
    return (None, None) if s is None else (s[0], s[1])


@register_kernel("upsample_nearest2d")
def upsample_nearest2d(ins, outs, attrs, scratch):
    aten.upsample_nearest2d.out(ins[0], attrs["output_size"], *_scales(attrs), out=outs[0])


@register_kernel("upsample_bilinear2d")
def upsample_bilinear2d(ins, outs, attrs, scratch):
    aten.upsample_bilinear2d.out(ins[0], attrs["output_size"], attrs["align_corners"],
                                 *_scales(attrs), out=outs[0])

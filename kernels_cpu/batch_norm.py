"""batch_norm (inference) CPU kernel: the per-channel affine map over dim 1,

    y = x * scale[c] + shift[c],  scale = w * rsqrt(var + eps),  shift = b - mean * scale
"""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel


@register_kernel("batch_norm")
def batch_norm(ins, outs, attrs, scratch):
    x, w, b, mean, var = ins
    out = outs[0]
    scale = torch.rsqrt(var + attrs["eps"])
    if w is not None:
        scale = scale * w
    shift = -mean * scale
    if b is not None:
        shift = shift + b
    per_channel = (x.shape[1],) + (1,) * (x.dim() - 2)
    torch.addcmul(shift.view(per_channel), x, scale.view(per_channel), out=out)

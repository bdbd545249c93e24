"""Scaled dot-product attention (attention.wgsl): one flash-style pass per query row."""
from __future__ import annotations

import math

import torch

from delegate.errors import UnsupportedError
from kernels_wgsl import Dispatch, broadcast_strides, register_wgsl, words

MAX_HEAD = 256


@register_wgsl("sdpa")
def sdpa(ins, outs, attrs, info):
    q, v, mask = ins[0], ins[2], ins[3] if len(ins) > 3 else None
    if q[3] > MAX_HEAD or v[3] > MAX_HEAD:
        raise UnsupportedError(f"sdpa head dims on WebGPU: expected at most {MAX_HEAD}, "
                               f"got E={q[3]}, Ev={v[3]}")
    mask_kind = 0 if mask is None else (1 if info.in_dtypes[3] == torch.bool else 2)

    def sizes(ins, outs, attrs):
        (b, hq, l, e), (_, hkv, s, ev) = ins[0], ins[2]
        scale = attrs.get("scale")
        scale = 1.0 / math.sqrt(e) if scale is None else float(scale)
        mstrides = broadcast_strides(ins[3], (b, hq, l, s)) if mask is not None else [0] * 4
        rows = b * hq * l if ev else 0
        return words(b, hq, hkv, l, s, e, ev, rows, scale, 0, 0, 0, mstrides), rows

    consts = (("MASK", mask_kind), ("CAUSAL", int(bool(attrs.get("is_causal")))))
    return [Dispatch("attention", "sdpa", (0, 1, 2, 3 if mask is not None else None, 4), (4,),
                     sizes, consts, label="sdpa")]

"""batch_norm (inference) on WebGPU (batch_norm.wgsl): one thread per element; absent weight or
bias bind nothing the shader reads."""
from __future__ import annotations

from kernels_wgsl import Dispatch, groups, numel, register_wgsl, words

WG = 64


@register_wgsl("batch_norm")
def batch_norm(ins, outs, attrs, info):
    has_w, has_b = ins[1] is not None, ins[2] is not None

    def sizes(ins, outs, attrs):
        x = ins[0]
        n = numel(x)
        return words(n, x[1], numel(x[2:]), float(attrs["eps"])), groups(n, WG)

    consts = (("HAS_WEIGHT", int(has_w)), ("HAS_BIAS", int(has_b)))
    args = (0, 1 if has_w else None, 2 if has_b else None, 3, 4, 5)
    return [Dispatch("batch_norm", "batch_norm", args, (5,), sizes, consts, label="batch_norm")]

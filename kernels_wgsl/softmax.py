"""Softmax (softmax.wgsl): one workgroup per row along `dim`, any dim, no transposes."""
from __future__ import annotations

from delegate.shape_math import norm_dim
from kernels_wgsl import Dispatch, numel, register_wgsl, words


@register_wgsl("softmax")
def softmax(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        shape = ins[0]
        if not shape:
            return words(1, 1, 1), 1
        d = norm_dim(attrs["dim"], len(shape))
        size, inner = shape[d], numel(shape[d + 1:])
        rows = numel(shape) // size if size else 0
        return words(rows, size, inner), rows

    return [Dispatch("softmax", "softmax", (0, 1), (1,), sizes, label="softmax")]

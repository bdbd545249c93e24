"""Rotary embedding (rope.wgsl, delegate/ops/rope.py): one dispatch, one thread per output
element, each reading its own channel, its pair partner and one cos and one sin entry.

The tables (last dim R/2 or R, leading dims broadcast to x's) are addressed as the broadcast
shape x.shape[:-1] + (width,) through zero strides, so no expanded copy is ever made.
"""
from __future__ import annotations

from kernels_wgsl import (Dispatch, broadcast_strides, groups, numel, padded, register_wgsl,
                          words)

WG = 256


@register_wgsl("rope")
def rope(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        x, table = ins[0], ins[1]
        view = tuple(x[:-1]) + (table[-1],)
        n = numel(outs[0])
        # three zero words: the uniform's shape array starts at the next 16-byte boundary
        return (words(n, x[-1], attrs["rotary_dim"], table[-1], len(x), 0, 0, 0,
                      padded(view), padded(broadcast_strides(table, view))),
                groups(n, WG))

    interleaved = int(attrs["style"] == "interleaved")
    return [Dispatch("rope", "rope", (0, 1, 2, 3), (3,), sizes,
                     (("INTERLEAVED", interleaved),), label=f"rope_{attrs['style']}")]

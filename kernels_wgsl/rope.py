"""Rotary embedding (rope.wgsl, delegate/ops/rope.py): one dispatch, one thread per output
element, each reading its own channel, its pair partner and one cos and one sin entry.
rope_pair rotates its two tensors in one dispatch whose grid covers both; rope_cache
rotates q, and k straight into its cache rows (walked as the cache write's strided copy
walks them), and copies v into its cache, in one grid.

The tables (last dim R/2 or R, leading dims broadcast to x's) are addressed as the broadcast
shape x.shape[:-1] + (width,) through zero strides, so no expanded copy is ever made.
"""
from __future__ import annotations

from kernels_wgsl import (Dispatch, broadcast_strides, groups, numel, padded, register_wgsl,
                          words)
from kernels_wgsl.shape import any_offset, rows_copy

WG = 256


def _rotation(x, table, rotary_dim: int) -> list:
    """The words of one rotated tensor's Rotation struct."""
    view = tuple(x[:-1]) + (table[-1],)
    # three zero words: the struct's shape array starts at the next 16-byte boundary
    return [numel(x), x[-1], rotary_dim, table[-1], len(x), 0, 0, 0,
            padded(view), padded(broadcast_strides(table, view))]


def _constants(attrs) -> tuple:
    return (("INTERLEAVED", int(attrs["style"] == "interleaved")),)


@register_wgsl("rope")
def rope(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        return words(*_rotation(ins[0], ins[1], attrs["rotary_dim"])), groups(numel(outs[0]), WG)

    return [Dispatch("rope", "rope", (0, 1, 2, 3), (3,), sizes, _constants(attrs),
                     label=f"rope_{attrs['style']}")]


@register_wgsl("rope_pair")
def rope_pair(ins, outs, attrs, info):
    # operands q, k, cos, sin, q', k'; bindings 1..4 are rope's (x, cos, sin, out), then k, k'
    def sizes(ins, outs, attrs):
        q, k, table, rd = ins[0], ins[1], ins[2], attrs["rotary_dim"]
        n = numel(outs[0]) + numel(outs[1])
        return words(*_rotation(q, table, rd), *_rotation(k, table, rd)), groups(n, WG)

    return [Dispatch("rope", "rope_pair", (0, 2, 3, 4, 1, 5), (4, 5), sizes, _constants(attrs),
                     label=f"rope_pair_{attrs['style']}")]


@register_wgsl("rope_cache")
def rope_cache(ins, outs, attrs, info):
    # operands cache, src, cache1, src1, q, cos, sin, cache', q'; bindings 1..4 are rope's
    # (q, cos, sin, q'), then k, k's cache, v, v's cache: cache' is cache's own buffer, cache1
    # is written in place as an input (as slice_scatter_pair's)
    k_first = attrs["rotated"] == 1
    k, k_cache, v, v_cache = (3, 2, 1, 7) if k_first else (1, 7, 3, 2)

    def sizes(ins, outs, attrs):
        rows = [rows_copy(ins[1], outs[0], attrs["src_dims"], attrs),
                rows_copy(ins[3], ins[2], attrs["src_dims1"], attrs)]
        kw, vw = rows[::-1] if k_first else rows
        q, table, rd = ins[4], ins[5], attrs["rotary_dim"]
        k_shape = ins[3] if k_first else ins[1]
        fields = [*_rotation(q, table, rd), *_rotation(k_shape, table, rd), *kw, *vw]
        return words(*fields), groups(numel(outs[1]) + kw[0] + vw[0], WG)

    return [Dispatch("rope", "rope_cache", (4, 5, 6, 8, k, k_cache, v, v_cache),
                     (8, k_cache, v_cache), sizes, _constants(attrs),
                     label=f"rope_cache_{attrs['style']}", fixed_grid=any_offset)]

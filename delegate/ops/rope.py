"""rope: rotary position embedding of x [..., D] by cos/sin tables, in one pass.

The first `rotary_dim` (R, even) channels of the last dim form R/2 pairs (a, b), rotated by
the angle of their pair; channels past R pass through unchanged (partial rotary):

    out_a = x_a cos_a - x_b sin_a        style "interleaved": pairs (2i, 2i+1) (Meta's Llama)
    out_b = x_b cos_b + x_a sin_b        style "half":        pairs (i, i + R/2) (HF rotate_half)

A table's last dim is R/2 (one angle per pair, cos_a = cos_b = cos[i]) or R (one per
channel, as HF's cos = cat(freqs, freqs) stores it); its leading dims broadcast to x's
leading dims (right-aligned, each equal or 1). cos and sin have one shape.

rope_pair is two ropes of one layer's q and k in one node: (q, k, cos, sin) -> (q', k'),
each output exactly its own rope's (the same arithmetic per element), q and k free to differ
in shape (GQA head counts). It saves a dispatch per layer on WebGPU.

rope_cache is a layer's rope_pair and its slice_scatter_pair (delegate/ops/shape.py) in one
node, for a k that only its cache write reads: (cache, src, cache1, src1, q, cos, sin) ->
(cache', q'). The two sources are written into rows [start, start + n) of dim of their
caches, each read through its permutation (src_dims, src_dims1), the one named by `rotated`
(0: src, 1: src1; that is k, the other v) rotated first in its own layout, exactly as its rope
would; q' is q's rope. Output 0 is cache updated in place, and cache1 is written in place as
slice_scatter_pair's input 2 is. Rotated k never exists as a tensor: a decode step's layer
runs one dispatch for rope and both cache writes instead of two.

None has an edge target: only the graph passes delegate/passes/rope.py and
delegate/passes/rope_cache.py emit them. Their kernels are kernels_cpu/rope.py and
kernels_wgsl/rope.*.
"""
from __future__ import annotations

from delegate.errors import DelegateError, UnsupportedError, expect
from delegate.ops import register_op
from delegate.ops._common import one_input
from delegate.ops.shape import infer_slice_scatter_pair

STYLES = ("interleaved", "half")


def table_width_ok(width, rotary_dim: int) -> bool:
    """A table's last dim: one angle per pair (R/2) or one per channel (R)."""
    return width in (rotary_dim // 2, rotary_dim)


def _infer_rope(in_shapes, attrs):
    one_input(in_shapes, 3)
    x, cos, sin = (tuple(s) for s in in_shapes[:3])
    style, rd = attrs["style"], attrs["rotary_dim"]
    expect(style in STYLES, DelegateError, "rope style", f"one of {STYLES}", repr(style))
    expect(len(x) >= 1, DelegateError, "rope x", "a tensor of rank 1 or more", x)
    expect(rd > 0 and rd % 2 == 0 and rd <= x[-1], DelegateError, "rope rotary_dim",
           f"an even size in (0, {x[-1]}] for x {x}", rd)
    expect(cos == sin, DelegateError, "rope sin", f"the cos table's shape {cos}", sin)
    expect(1 <= len(cos) <= len(x) and table_width_ok(cos[-1], rd), DelegateError,
           "rope cos", f"rank 1..{len(x)} with last dim {rd // 2} or {rd}", cos)
    lead = x[len(x) - len(cos):-1]
    expect(all(t in (1, s) for t, s in zip(cos[:-1], lead)), DelegateError, "rope cos",
           f"leading dims broadcasting to {x[:-1]}", cos)
    return [x]


def _infer_rope_pair(in_shapes, attrs):
    one_input(in_shapes, 4)
    q, k, cos, sin = in_shapes[:4]
    return _infer_rope([q, cos, sin], attrs) + _infer_rope([k, cos, sin], attrs)


def _infer_rope_cache(in_shapes, attrs):
    one_input(in_shapes, 7)
    expect(attrs["rotated"] in (0, 1), DelegateError, "rope_cache rotated", "0 or 1",
           attrs["rotated"])
    cache, src, cache1, src1, q, cos, sin = in_shapes
    _infer_rope([(src, src1)[attrs["rotated"]], cos, sin], attrs)
    return infer_slice_scatter_pair([cache, src, cache1, src1], attrs) + \
        _infer_rope([q, cos, sin], attrs)


def _lower_rope(ctx, node):
    # unreachable through the registry (no targets); says so if a plugin routes a node here
    raise UnsupportedError(f"node {node.name}: expected rope, rope_pair and rope_cache only "
                           f"from the rope and rope_cache passes (delegate/passes/), got an "
                           f"edge node lowered as it")


register_op("rope", (), _infer_rope, _lower_rope,
            doc="rotary embedding of x by cos/sin tables, interleaved or rotate-half pairs, "
                "partial rotary_dim; emitted by the rope pass",
            attrs={"style": "str", "rotary_dim": "int"}, arity=(3, 1))
register_op("rope_pair", (), _infer_rope_pair, _lower_rope,
            doc="two ropes of one cos/sin pair in one node (a layer's q and k), each output "
                "bit for bit its own rope's; emitted by the rope pass",
            attrs={"style": "str", "rotary_dim": "int"}, arity=(4, 2))
register_op("rope_cache", (), _infer_rope_cache, _lower_rope,
            doc="a layer's rope_pair and slice_scatter_pair in one node: k rotated straight into "
                "its cache rows, v copied into its own, q rotated; emitted by the rope_cache pass",
            attrs={"style": "str", "rotary_dim": "int", "dim": "int", "start": "symint",
                   "src_dims": "ints", "src_dims1": "ints", "rotated": "int"},
            arity=(7, 2), in_place=True)

"""convolution (convolution.wgsl): 1-D and 2-D, plain or transposed, grouped and depthwise, by
direct summation. A 1-D convolution runs as a 2-D one of height 1.

`conv_tile4`, when a group has at least 4 output channels: one thread computes 4 output
channels of one (n, oy, ox), so every input value it loads feeds 4 accumulators.
`conv_scalar` otherwise (depthwise: one output channel per group): one thread per element.
"""
from __future__ import annotations

from kernels_wgsl import Dispatch, groups, numel, register_wgsl, words

WG = 64
TILE = 4   # output channels per thread in conv_tile4


def _as_2d(attrs, ins, outs) -> dict:
    """Spatial sizes and per-dim attributes as (h, w) pairs; 1-D gets a unit height."""
    x, w, y = ins[0], ins[1], outs[0]
    pad2 = (lambda v, fill: list(v) if len(v) == 2 else [fill] + list(v))
    return {"in": pad2(x[2:], 1), "k": pad2(w[2:], 1), "out": pad2(y[2:], 1),
            "stride": pad2(attrs["stride"], 1), "padding": pad2(attrs["padding"], 0),
            "dilation": pad2(attrs["dilation"], 1)}


def _params(ins, outs, attrs) -> tuple:
    """(params, cout per group, threads); weight strides over (co local, ci local) let one
    kernel read [C_out, C_in/g, kh, kw] (plain) and [C_in, C_out/g, kh, kw] (transposed)."""
    x, y, g = ins[0], outs[0], int(attrs["groups"])
    d = _as_2d(attrs, ins, outs)
    kk = d["k"][0] * d["k"][1]
    cin_pg, cout_pg = x[1] // g, y[1] // g
    transposed = bool(attrs["transposed"])
    s_co, s_ci = (kk, cout_pg * kk) if transposed else (cin_pg * kk, kk)
    tiles = groups(cout_pg, TILE) if cout_pg >= TILE else cout_pg
    params = words(x[0], g, cin_pg, cout_pg, *d["in"], *d["out"], *d["k"], *d["stride"],
                   *d["padding"], *d["dilation"], s_co, s_ci, tiles, int(transposed))
    threads = numel(y) // cout_pg * tiles if cout_pg else 0
    return params, cout_pg, threads


@register_wgsl("convolution")
def convolution(ins, outs, attrs, info):
    has_bias = len(ins) > 2 and ins[2] is not None
    consts = (("HAS_BIAS", int(has_bias)),)
    args = (0, 1, 2 if has_bias else None, 3)

    def route(tiled: bool):
        def sizes(ins, outs, attrs):
            params, cout_pg, threads = _params(ins, outs, attrs)
            return params, (groups(threads, WG) if tiled == (cout_pg >= TILE) else 0)

        return sizes

    return [Dispatch("convolution", "conv_tile4", args, (3,), route(True), consts,
                     label="conv_tile4"),
            Dispatch("convolution", "conv_scalar", args, (3,), route(False), consts,
                     label="conv_scalar")]

"""Matrix products (linear.wgsl): linear, mm, bmm and addmm run `steel_gemm`, or `coop_gemv`
when the live M is 1 (decode).

Each op only describes its operands as a batched strided GEMM: sizes (M, N, K, batch), element
strides of a, of the right-hand matrix read as [K, N], and of the bias broadcast to [M, N].
"""
from __future__ import annotations

import struct

from delegate.errors import UnsupportedError
from kernels_wgsl import (Dispatch, broadcast_strides, groups, numel, register_wgsl, words)

TILE = 64
GEMV_COLS = 4


def gemm_params(m, n, k, batch, a_strides, b_strides, bias_strides=(0, 0, 0),
                alpha: float = 1.0, beta: float = 1.0):
    """(params, workgroups); strides are (batch, row, col) in elements."""
    tiles_m, tiles_n = groups(m, TILE), groups(n, TILE)
    count = tiles_m * tiles_n * batch if m and n else 0
    return (words(m, n, k, batch, *a_strides, tiles_m, *b_strides, tiles_n, *bias_strides, 0,
                  float(alpha), float(beta)), count)


def _gemm(args, out: int, sizes, has_bias: bool, label: str) -> list:
    """The tiled GEMM for M > 1 and the cooperative GEMV for M == 1, routed per execute by
    live M: the one not taken reports 0 workgroups and is skipped."""
    consts = (("HAS_BIAS", int(has_bias)),)

    def gemm(ins, outs, attrs):
        params, count = sizes(ins, outs, attrs)
        return params, (0 if _rows(params) == 1 else count)

    def gemv(ins, outs, attrs):
        params, count = sizes(ins, outs, attrs)
        m, n, _, batch = struct.unpack_from("<4I", params)
        return params, (groups(n, GEMV_COLS) * batch if m == 1 and count else 0)

    return [Dispatch("linear", "steel_gemm", args, (out,), gemm, consts, label=label),
            Dispatch("linear", "coop_gemv", args, (out,), gemv, consts, label=label)]


def _rows(params: bytes) -> int:
    return struct.unpack_from("<I", params)[0]


def _bias_2d(bias, out_shape) -> tuple:
    """(row, col) strides of a bias broadcast to out_shape, whose leading dims fold into rows."""
    strides = broadcast_strides(bias, out_shape)
    lead = strides[:-1]
    if len(out_shape) > 2 and any(lead):
        raise UnsupportedError(f"bias {tuple(bias)}: expected one broadcast over the rows of "
                               f"{tuple(out_shape)}, got one varying along them")
    return (lead[-1] if len(out_shape) == 2 else 0), strides[-1]


@register_wgsl("linear")
def linear(ins, outs, attrs, info):
    has_bias = len(ins) > 2 and ins[2] is not None
    _bias_2d(ins[2], outs[0]) if has_bias else None

    def sizes(ins, outs, attrs):
        x, wt = ins[0], ins[1]
        k, n = x[-1], wt[0]
        m = numel(x[:-1])
        bias = (0,) + _bias_2d(ins[2], outs[0]) if has_bias else (0, 0, 0)
        return gemm_params(m, n, k, 1, (0, k, 1), (0, 1, k), bias)

    return _gemm((0, 1, 2 if has_bias else None, 3), 3, sizes, has_bias, "linear")


@register_wgsl("mm")
def mm(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        (m, k), n = ins[0], ins[1][1]
        return gemm_params(m, n, k, 1, (0, k, 1), (0, n, 1))

    return _gemm((0, 1, None, 2), 2, sizes, False, "mm")


@register_wgsl("bmm")
def bmm(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        (b, m, k), n = ins[0], ins[1][2]
        return gemm_params(m, n, k, b, (m * k, k, 1), (k * n, n, 1))

    return _gemm((0, 1, None, 2), 2, sizes, False, "bmm")


@register_wgsl("addmm")
def addmm(ins, outs, attrs, info):
    # beta == 0 ignores the bias entirely (torch does not propagate its NaNs then)
    has_bias = float(attrs.get("beta", 1.0)) != 0.0

    def sizes(ins, outs, attrs):
        (m, k), n = ins[1], ins[2][1]
        bias = (0,) + _bias_2d(ins[0], outs[0])
        return gemm_params(m, n, k, 1, (0, k, 1), (0, n, 1), bias,
                           attrs.get("alpha", 1.0), attrs.get("beta", 1.0))

    return _gemm((1, 2, 0 if has_bias else None, 3), 3, sizes, has_bias, "addmm")

"""linear_q4gsw on WebGPU: two kernels, routed per execute by the live M.

    M == 1  q4gsw_coop_gemv.wgsl    64 lanes, 2 output columns per workgroup (decode)
    M > 1   q4gsw_steel_gemm.wgsl   64x64 tile, 16x16 threads, BK 16 (prefill); f16 multiply
                                    with f32 accumulation when the device has shader-f16, else
                                    all f32 (the prelude picks tile_t)

Both dispatches are built once per load; `sizes` gives the one that does not fit the live M a
workgroup count of 0, so the executor skips it. Operands: x [..., K], packed int32 [N, K/8],
scales float32 [K/gs, N padded to 4], bias [N] or absent, out [..., N].
"""
from __future__ import annotations


from kernels_wgsl import Dispatch, groups, numel, register_wgsl, words

TILE = 64
GEMV_COLS = 2
GEMM, GEMV = "q4gsw_steel_gemm", "q4gsw_coop_gemv"
PRELUDE = {True: "enable f16;\nalias tile_t = f16;", False: "alias tile_t = f32;"}


def q4_params(m: int, attrs: dict) -> bytes:
    k, n = int(attrs["K"]), int(attrs["N"])
    return words(m, n, k, int(attrs["group_size"]), groups(n, 4) * 4, k // 8,
                 groups(m, TILE), groups(n, TILE))


@register_wgsl("linear_q4gsw")
def linear_q4gsw(ins, outs, attrs, info):
    has_bias = len(ins) > 3 and ins[3] is not None
    n = int(attrs["N"])
    constants = (("HAS_BIAS", int(has_bias)),)
    args = (0, 1, 2, 3 if has_bias else None, 4)

    def gemm_sizes(ins, outs, attrs):
        m = numel(ins[0][:-1])
        return q4_params(m, attrs), (groups(m, TILE) * groups(n, TILE) if m > 1 else 0)

    def gemv_sizes(ins, outs, attrs):
        m = numel(ins[0][:-1])
        return q4_params(m, attrs), (groups(n, GEMV_COLS) if m == 1 else 0)

    f16 = bool(info.gpu.has_f16)
    return [
        Dispatch(GEMM, GEMM, args, (4,), gemm_sizes, constants,
                 label=GEMM + ("_f16" if f16 else "_f32"), prelude=PRELUDE[f16]),
        Dispatch(GEMV, GEMV, args, (4,), gemv_sizes, constants, label=GEMV),
    ]


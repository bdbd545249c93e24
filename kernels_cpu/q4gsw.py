"""linear_q4gsw and linear_q4gsw_multi on CPU: dequantize column tiles on the fly inside the
thread pool.

    out[m, n] = bias[n] + sum_k x[m, k] * (q[n, k] * scales[k / gs, n])  (+ residual[m, n])
    q[n, k]   = ((packed[n, k/8] >> 4*(k%8)) & 0xF) - 8     (packed: int32 words of uint8 [N, K/2])

Each worker owns a contiguous range of column tiles and one scratch slice: it unpacks a tile
of weight rows into its slice as float32 [tile, K], scales it per group, and runs one addmm
into out[:, tile], then, with a residual (delegate/passes/residual_add.py), one add of the
residual's tile into it: the same torch calls as the unfused addmm and add, so the same bits.
Tiles are TILE_BYTES of float32, however many workers there are: every
torch call re-takes the GIL, so many small tiles convoy on it (on 16 cores, K = N = 2048 took
32 ms in 256 KiB tiles, 10 ms in 1 MiB tiles over 16 workers, 2.4 ms in 4 MiB tiles over 4).
No dequantized copy of the whole weight ever exists; the resident weight stays packed
(0.5 B/param + 4/gs B/param of scales).

linear_q4gsw_multi (fused q/k/v or gate/up) holds its outputs' weights concatenated along N
and makes one pass over them: one parallel_for over the tiles of every output, each tile's mm
written straight into its own output. Tiles never straddle two outputs and each output is
tiled as its own linear_q4gsw would be, so every torch call is the unfused one's: the outputs
are bit-identical to the unfused linears.

With norm_eps (delegate/passes/rms_norm_linear.py), linear_q4gsw_multi and linear_q4gsw_swiglu
first run the rms_norm kernel (kernels_cpu/normalization.py) on x into the front of their scratch
and take that as x: the unfused rms_norm's calls, so its bits.

linear_q4gsw_swiglu (gate/up and their SwiGLU product) holds the two weights' rows
interleaved; it computes the gate tiles into its output and the up tiles into scratch, tiled
and called as linear_q4gsw_multi does, then runs silu_mul's chunks over the two: the unfused
linears' and silu_mul's torch calls, so the unfused bits.

torch's packed int4 kernel (aten._weight_int4pack_mm_for_cpu, float32 activations) matches
the numerics and was measured against this one (bench/q4gsw.py, K = N = 2048): on 2 cores it
is ~2x slower at M = 1 and ~60x slower at M = 64; on 16 cores it is ~2x faster at M = 1 but
~20x slower at M = 64. It also needs its own interleaved packing, a second resident copy of
the weight (or a per-call repack through an int32 [N, K] temporary), so it is not used.
"""
from __future__ import annotations

import torch

from delegate.shape_math import numel
from kernels_cpu import register_kernel
from kernels_cpu.elementwise import map_chunks, silu_mul_chunk
from kernels_cpu.normalization import rms_norm
from kernels_cpu.threadpool import get_pool, typed, worker_slices

# The float32 weight tile a worker dequantizes at once.
TILE_BYTES = 4 << 20


def tile_n(k: int, n: int) -> int:
    return max(4, min(n, TILE_BYTES // (4 * k)))


def _per_worker(k: int, n: int) -> int:
    t = tile_n(k, n)
    return t * k * 4 + t * (k // 2) + 64   # float32 tile + one nibble plane (uint8)


def column_tiles(k: int, widths) -> list:
    """[(output, first column in the weight, first column in the output, columns)]: each
    output of width w in tiles of tile_n(k, w), as a linear_q4gsw of that width tiles it."""
    tiles, start = [], 0
    for i, w in enumerate(widths):
        t = tile_n(k, w)
        tiles += [(i, start + c, c, min(t, w - c)) for c in range(0, w, t)]
        start += w
    return tiles


def _scratch(k: int, widths, workers: int) -> int:
    per = max(_per_worker(k, w) for w in widths)
    return min(workers, len(column_tiles(k, widths))) * ((per + 63) // 64 * 64)


def scratch_nbytes(in_shapes, attrs, workers: int) -> int:
    return _scratch(attrs["K"], [attrs["N"]], workers)


def _norm_nbytes(in_shapes, attrs) -> int:
    """Scratch of the normalized x, in front of the rest (0 without a fused norm)."""
    if attrs.get("norm_eps") is None:
        return 0
    return (numel(in_shapes[0]) * 4 + 63) // 64 * 64


def normalized(ins, attrs, scratch) -> tuple:
    """(x, the scratch after it): ins[0], or with norm_eps rms_norm(ins[0], ins[3]) computed
    by the rms_norm kernel into the front of scratch."""
    nbytes = _norm_nbytes([tuple(ins[0].shape)], attrs)
    if not nbytes:
        return ins[0], scratch
    y = typed(scratch, torch.float32, tuple(ins[0].shape))
    rms_norm([ins[0], ins[3]], [y], {"normalized_shape": [attrs["K"]], "eps": attrs["norm_eps"]},
             None)
    return y, scratch[nbytes:]


def multi_scratch_nbytes(in_shapes, attrs, workers: int) -> int:
    return _norm_nbytes(in_shapes, attrs) + _scratch(attrs["K"], attrs["widths"], workers)


def dequantize_tile(packed_u8: torch.Tensor, scales: torch.Tensor, n0: int, n1: int,
                    group_size: int, buf: torch.Tensor) -> torch.Tensor:
    """float32 [n1 - n0, K] weight rows n0..n1, written into `buf` (uint8 scratch)."""
    t, half = n1 - n0, packed_u8.shape[1]
    k = 2 * half
    w = typed(buf, torch.float32, (t, half, 2))
    nib = typed(buf[t * k * 4:], torch.uint8, (t, half))
    rows = packed_u8[n0:n1]
    torch.bitwise_and(rows, 15, out=nib)
    w[:, :, 0].copy_(nib)                       # even k: low nibble
    torch.bitwise_right_shift(rows, 4, out=nib)
    w[:, :, 1].copy_(nib)                       # odd k: high nibble
    w = w.view(t, k // group_size, group_size)
    w.sub_(8.0).mul_(scales[:, n0:n1].t().unsqueeze(-1))
    return w.view(t, k)


def concatenated(packed, scales, k: int, widths) -> list:
    """(packed rows as uint8 [N_i, K/2], scales [K/gs, N_i]) of each W_i, the W_i concatenated
    along N."""
    packed_u8 = packed.view(torch.uint8).view(-1, k // 2)
    starts = [sum(widths[:i]) for i in range(len(widths))]
    return [(packed_u8[a:a + w], scales[:, a:a + w]) for a, w in zip(starts, widths)]


def interleaved(packed, scales, k: int, width: int) -> list:
    """The same for linear_q4gsw_swiglu's two W_i, their rows interleaved (2j: W_0, 2j+1: W_1)."""
    packed_u8 = packed.view(torch.uint8).view(-1, k // 2)
    return [(packed_u8[i::2], scales[:, i:2 * width:2]) for i in (0, 1)]


def _dequant_gemm(x, weights, bias, outs, k: int, gs: int, widths, scratch,
                  residual=None) -> None:
    """outs[i][..., :] = x @ dequant(W_i)^T (+ bias) (+ residual), weights[i] W_i's packed
    rows and scales (a residual only with one output)."""
    x2 = x.reshape(-1, k)
    out2 = [o.view(-1, w) for o, w in zip(outs, widths)]
    res2 = None if residual is None else residual.reshape(-1, widths[0])
    tiles = column_tiles(k, widths)
    pool = get_pool()
    per = max(_per_worker(k, w) for w in widths)
    slices = worker_slices(scratch, min(pool.num_threads, len(tiles)), per)

    def run(worker: int, t0: int, t1: int) -> None:
        for i, _, c0, cols in tiles[t0:t1]:
            w = dequantize_tile(*weights[i], c0, c0 + cols, gs, slices[worker])
            y = out2[i][:, c0:c0 + cols]
            if bias is None:
                torch.mm(x2, w.t(), out=y)
            else:
                torch.addmm(bias[c0:c0 + cols], x2, w.t(), out=y)
            if res2 is not None:
                torch.add(y, res2[:, c0:c0 + cols], out=y)

    pool.parallel_for(len(tiles), run)


@register_kernel("linear_q4gsw", scratch_nbytes=scratch_nbytes)
def linear_q4gsw(ins, outs, attrs, scratch):
    bias = ins[3] if len(ins) > 3 else None
    residual = ins[4] if len(ins) > 4 else None
    k, n = attrs["K"], attrs["N"]
    _dequant_gemm(ins[0], concatenated(ins[1], ins[2], k, [n]), bias, outs, k,
                  attrs["group_size"], [n], scratch, residual)


@register_kernel("linear_q4gsw_multi", scratch_nbytes=multi_scratch_nbytes)
def linear_q4gsw_multi(ins, outs, attrs, scratch):
    k, widths = attrs["K"], attrs["widths"]
    x, scratch = normalized(ins, attrs, scratch)
    _dequant_gemm(x, concatenated(ins[1], ins[2], k, widths), None, outs, k,
                  attrs["group_size"], widths, scratch)


def _up_nbytes(in_shapes, attrs) -> int:
    return (numel(in_shapes[0][:-1]) * (attrs["N"] // 2) * 4 + 63) // 64 * 64


def swiglu_scratch_nbytes(in_shapes, attrs, workers: int) -> int:
    half = attrs["N"] // 2
    return (_norm_nbytes(in_shapes, attrs) + _up_nbytes(in_shapes, attrs)
            + _scratch(attrs["K"], [half, half], workers))


@register_kernel("linear_q4gsw_swiglu", scratch_nbytes=swiglu_scratch_nbytes)
def linear_q4gsw_swiglu(ins, outs, attrs, scratch):
    """The gate into out and the up into scratch, each as its own linear_q4gsw would compute
    it, then silu_mul's own chunks (kernels_cpu/elementwise.py) over them: the unfused bits."""
    k, half, out = attrs["K"], attrs["N"] // 2, outs[0]
    x, scratch = normalized(ins, attrs, scratch)
    up_bytes = _up_nbytes([tuple(ins[0].shape)], attrs)
    up = typed(scratch, torch.float32, tuple(out.shape))
    _dequant_gemm(x, interleaved(ins[1], ins[2], k, half), None, [out, up], k,
                  attrs["group_size"], [half, half], scratch[up_bytes:])
    map_chunks(silu_mul_chunk, out, out, up)

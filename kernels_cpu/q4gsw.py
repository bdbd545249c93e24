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

torch's packed int4 kernel (aten._weight_int4pack_mm_for_cpu, float32 activations) matches
the numerics and was measured against this one (bench/q4gsw.py, K = N = 2048): on 2 cores it
is ~2x slower at M = 1 and ~60x slower at M = 64; on 16 cores it is ~2x faster at M = 1 but
~20x slower at M = 64. It also needs its own interleaved packing, a second resident copy of
the weight (or a per-call repack through an int32 [N, K] temporary), so it is not used.
"""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel
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


def multi_scratch_nbytes(in_shapes, attrs, workers: int) -> int:
    return _scratch(attrs["K"], attrs["widths"], workers)


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


def _dequant_gemm(x, packed, scales, bias, outs, k: int, gs: int, widths, scratch,
                  residual=None) -> None:
    """outs[i][..., :] = x @ dequant(W_i)^T (+ bias) (+ residual), W the W_i concatenated
    along N (a residual only with one output)."""
    x2 = x.reshape(-1, k)
    out2 = [o.view(-1, w) for o, w in zip(outs, widths)]
    res2 = None if residual is None else residual.reshape(-1, widths[0])
    packed_u8 = packed.view(torch.uint8).view(-1, k // 2)
    tiles = column_tiles(k, widths)
    pool = get_pool()
    per = max(_per_worker(k, w) for w in widths)
    slices = worker_slices(scratch, min(pool.num_threads, len(tiles)), per)

    def run(worker: int, t0: int, t1: int) -> None:
        for i, n0, c0, cols in tiles[t0:t1]:
            w = dequantize_tile(packed_u8, scales, n0, n0 + cols, gs, slices[worker])
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
    _dequant_gemm(ins[0], ins[1], ins[2], bias, outs, attrs["K"], attrs["group_size"],
                  [attrs["N"]], scratch, residual)


@register_kernel("linear_q4gsw_multi", scratch_nbytes=multi_scratch_nbytes)
def linear_q4gsw_multi(ins, outs, attrs, scratch):
    _dequant_gemm(ins[0], ins[1], ins[2], None, outs, attrs["K"], attrs["group_size"],
                  attrs["widths"], scratch)

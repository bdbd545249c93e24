"""Sweep of the SDPA kernels' schedules on this GPU, to route them from measurements.

    python -m bench.sdpa_tiles [--reps N]

- prefill: each PREFILL_TILES entry and each of CANDIDATE_TILES (rows, keys) that fits the
  adapter, forced alone, on the causal T=512 prefills of bench/kernels.py (32/32 and 32/8
  heads, d=64) and T=2048 32/8;
- prefill splits: PREFILL_MIN_GRID x PREFILL_SPLIT_KEYS (the routed tile split over the keys,
  plus combine) on the causal T=512 prefills;
- decode: SPLIT_KEYS (keys per flash-decoding split) on the S=2048 decode, 32/8 heads;
- profile: the routed prefill with its Q K^T loop cut to one head dim, its P V update cut to
  the rescale, and both, on the causal T=512 prefills (what the arithmetic costs; the cut
  kernels' outputs are wrong by design and go unchecked). Only with --only profile.
Each figure is GPU timestamps (min over the timer's runs) and is checked against torch's SDPA.
"""
from __future__ import annotations

import argparse
import sys

from bench.kernels import CASES, SdpaCase, time_ours
from bench.q4gsw import Gpu, shader_cut
from kernels_wgsl import attention

PREFILL_CASES = [CASES[1], CASES[2],
                 SdpaCase("prefill causal T=2048 32/8 heads d=64", 32, 8, 2048, 2048, 64, True)]
DECODE_CASE = CASES[3]
SPLIT_KEYS = (32, 64, 128, 256)
# tiles tried beside PREFILL_TILES: more keys a tile (fewer barriers a key, more threads), fewer
# rows (more workgroups on the causal triangle)
# ((16, 128) and (16, 64) lost by 2-3x on the H100, bench/results/sdpa_tiles_h100.txt, and left)
CANDIDATE_TILES = ((32, 64), (64, 16))
# (PREFILL_MIN_GRID, PREFILL_SPLIT_KEYS): the first leaves a 256-workgroup grid unsplit
PREFILL_SPLITS = ((256, 128), (1024, 128), (1024, 256), (2048, 64))
SPLIT_CASES = [CASES[0], CASES[2]]
PARTS = ("tiles", "splits", "decode")
# the cuts of the profile: (text of attention.wgsl, its replacement)
_QK_LOOP = ("    for (var c = 0u; c < DE4; c = c + 1u) {\n        let d = 4u * c;\n"
            "        a = outer4(a, p_q[d * RG + rq], p_kv[d * NKS + ks]);")
CUT_QK = (_QK_LOOP, _QK_LOOP.replace("c < DE4", "c < 1u"))
CUT_PV = ("        acc = prefill_values(acc, alpha, rq, ks);\n",
          "        acc = Acc(quad_scale(acc.c0, alpha), quad_scale(acc.c1, alpha), acc.c2, acc.c3);\n")
PROFILE = (("full kernel", ()), ("no Q K^T FMAs", (CUT_QK,)), ("no P V FMAs", (CUT_PV,)),
           ("neither", (CUT_QK, CUT_PV)))


def timed(gpu: Gpu, c: SdpaCase, reps: int, check: bool = True) -> tuple:
    """(seconds per call, by timestamps where the adapter has them, else wall; labels)."""
    t_ts, t_wall, labels = time_ours(gpu, c, reps, check)
    return (t_ts if t_ts is not None else t_wall), labels


def prefill_rows(gpu: Gpu, reps: int) -> None:
    storage = gpu.dev.limits["max-compute-workgroup-storage-size"]
    routed = attention.prefill_tile(64, 64, storage)
    print(f"prefill tiles (rows, keys); routed now: {(routed.br, routed.bc)}; TF/s")
    print(f"{'tile':>10} {'threads':>8} " + " ".join(f"{c.name:>40}" for c in PREFILL_CASES))
    tiles = attention.PREFILL_TILES
    for br, bc in tiles + tuple(t for t in CANDIDATE_TILES if t not in tiles):
        attention.PREFILL_TILES = ((br, bc),)
        tile = attention.prefill_tile(64, 64, storage)
        if tile is None:
            print(f"{str((br, bc)):>10}  needs more than {storage} bytes of workgroup memory")
            continue
        figures = [c.flops() / timed(gpu, c, reps)[0] * 1e-12 for c in PREFILL_CASES]
        print(f"{str((br, bc)):>10} {tile.threads:>8} " + " ".join(f"{f:>40.3f}" for f in figures),
              flush=True)
    attention.PREFILL_TILES = tiles


def split_rows(gpu: Gpu, reps: int) -> None:
    routed = attention.PREFILL_MIN_GRID, attention.PREFILL_SPLIT_KEYS
    print(f"prefill splits of the routed tile; routed now: min grid {routed[0]}, "
          f"{routed[1]} keys a split; TF/s")
    print(f"{'min grid':>8} {'keys':>5} " + " ".join(f"{c.name:>40}" for c in SPLIT_CASES))
    for grid, keys in PREFILL_SPLITS:
        attention.PREFILL_MIN_GRID, attention.PREFILL_SPLIT_KEYS = grid, keys
        cells = []
        for c in SPLIT_CASES:
            t, labels = timed(gpu, c, reps)
            cells.append(f"{c.flops() / t * 1e-12:.3f} ({labels})")
        print(f"{grid:>8} {keys:>5} " + " ".join(f"{x:>40}" for x in cells), flush=True)
    attention.PREFILL_MIN_GRID, attention.PREFILL_SPLIT_KEYS = routed


def decode_rows(gpu: Gpu, reps: int) -> None:
    print(f"decode {DECODE_CASE.name}: SPLIT_KEYS (routed now {attention.SPLIT_KEYS}); µs")
    routed = attention.SPLIT_KEYS
    for keys in SPLIT_KEYS:
        attention.SPLIT_KEYS = keys
        t, labels = timed(gpu, DECODE_CASE, reps)
        print(f"{keys:>10} {t * 1e6:>10.2f}  {labels}", flush=True)
    attention.SPLIT_KEYS = routed


def profile_rows(gpu: Gpu, reps: int) -> None:
    print("prefill profile: the routed kernel with its FMA loops cut; us")
    print(f"{'variant':>16} " + " ".join(f"{c.name:>40}" for c in PREFILL_CASES[:2]))
    for name, cuts in PROFILE:
        with shader_cut("attention", cuts):
            times = [timed(gpu, c, reps, check=not cuts)[0] for c in PREFILL_CASES[:2]]
        print(f"{name:>16} " + " ".join(f"{t * 1e6:>40.2f}" for t in times), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="dispatches per timing")
    ap.add_argument("--only", default=",".join(PARTS), help=f"of {','.join(PARTS)},profile")
    args = ap.parse_args(argv)
    parts = args.only.split(",")
    gpu = Gpu()
    print(f"# {gpu.dev.name}")
    for name, rows in zip(PARTS + ("profile",),
                          (prefill_rows, split_rows, decode_rows, profile_rows)):
        if name in parts:
            rows(gpu, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sweep of the SDPA kernels' schedules on this GPU, to route them from measurements.

    python -m bench.sdpa_tiles [--reps N]

- prefill: each PREFILL_TILES entry and each of CANDIDATE_TILES (rows, keys) that fits the
  adapter, forced alone, on the causal T=512 prefills of bench/kernels.py (32/32 and 32/8
  heads, d=64) and T=2048 32/8;
- decode: SPLIT_KEYS (keys per flash-decoding split) on the S=2048 decode, 32/8 heads.
Each figure is GPU timestamps (min over the timer's runs) and is checked against torch's SDPA.
"""
from __future__ import annotations

import argparse
import sys

from bench.kernels import CASES, SdpaCase, time_ours
from bench.q4gsw import Gpu
from kernels_wgsl import attention

PREFILL_CASES = [CASES[1], CASES[2],
                 SdpaCase("prefill causal T=2048 32/8 heads d=64", 32, 8, 2048, 2048, 64, True)]
DECODE_CASE = CASES[3]
SPLIT_KEYS = (32, 64, 128, 256)
# tiles tried beside PREFILL_TILES: more keys a tile (fewer barriers a key, more threads), fewer
# rows (more workgroups on the causal triangle)
CANDIDATE_TILES = ((32, 64), (16, 128), (16, 64), (64, 16))


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
        figures = []
        for c in PREFILL_CASES:
            t_ts, t_wall, _ = time_ours(gpu, c, reps)
            figures.append(c.flops() / (t_ts if t_ts is not None else t_wall) * 1e-12)
        print(f"{str((br, bc)):>10} {tile.threads:>8} " + " ".join(f"{f:>40.3f}" for f in figures),
              flush=True)
    attention.PREFILL_TILES = tiles


def decode_rows(gpu: Gpu, reps: int) -> None:
    print(f"decode {DECODE_CASE.name}: SPLIT_KEYS (routed now {attention.SPLIT_KEYS}); µs")
    routed = attention.SPLIT_KEYS
    for keys in SPLIT_KEYS:
        attention.SPLIT_KEYS = keys
        t_ts, t_wall, labels = time_ours(gpu, DECODE_CASE, reps)
        print(f"{keys:>10} {(t_ts if t_ts is not None else t_wall) * 1e6:>10.2f}  {labels}",
              flush=True)
    attention.SPLIT_KEYS = routed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="dispatches per timing")
    args = ap.parse_args(argv)
    gpu = Gpu()
    print(f"# {gpu.dev.name}")
    prefill_rows(gpu, args.reps)
    decode_rows(gpu, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())

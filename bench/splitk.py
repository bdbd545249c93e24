"""Sweep kernels_wgsl.q4gsw.K_SPLIT (split K of the 128x128 q4gsw GEMM) on the Llama-3.2-1B-
shaped layer of bench/overhead.py: per-dispatch GPU timestamps, min of runs, at T = 512 and 128.

    python3 -m bench.splitk [off|CHUNK ...]     (default: off 2048 1024 512)

The builders read K_SPLIT at load, so each value gets its own load of one lowered program.
Results: bench/results/splitk_h100.txt.
"""
from __future__ import annotations

import sys
from collections import defaultdict

import torch

from bench.overhead import llama_layer, load, warm_gpu
from kernels_wgsl import q4gsw as wq


def per_dispatch(executor, x, runs: int = 8) -> tuple:
    """(min summed seconds, {(index, label): min seconds}) over `runs` profiled executes."""
    best, total = defaultdict(lambda: float("inf")), float("inf")
    for _ in range(runs):
        _, times, _ = executor.execute_profiled([x])
        total = min(total, sum(s for _, s in times))
        for i, (label, s) in enumerate(times):
            best[(i, label)] = min(best[(i, label)], s)
    return total, best


def main(argv=None) -> None:
    args = sys.argv[1:] if argv is None else argv
    chunks = [None if a == "off" else int(a) for a in args] or [None, 2048, 1024, 512]
    pte = llama_layer()
    for i, chunk in enumerate(chunks):
        wq.K_SPLIT = chunk
        prog, m = load(pte, "webgpu")
        (_, executor), = m.delegates
        try:
            warm_gpu(m, torch.randn(1, 512, 2048), 2.0 if i == 0 else 0.7)
            for t in (512, 128):
                total, best = per_dispatch(executor, torch.randn(1, t, 2048))
                parts = ", ".join(f"{label} {s * 1e6:.1f}" for (_, label), s in sorted(best.items()))
                print(f"K_SPLIT={chunk} T={t}: sum {total * 1e6:.1f} us, {len(best)} dispatches; "
                      f"{parts}", flush=True)
        finally:
            prog.destroy()


if __name__ == "__main__":
    main()

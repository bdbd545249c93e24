"""Wall-clock timing shared by the CLI, the demo and the benches (imports nothing of ours)."""
from __future__ import annotations

import time


def timed(fn, runs: int):
    """(last result, min milliseconds over `runs` calls after one warm-up)."""
    out = fn()
    best = float("inf")
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best * 1e3

"""Soak through the public API: N load/destroy cycles and N executes of a small model's .pte,
on cpu and webgpu, reporting process RSS and live wgpu objects; exits non-zero on growth.

    python bench/soak.py --cycles 300 --executes 3000 --devices cpu webgpu

A cycle is load_program -> load_method -> execute -> destroy; the executes reuse one loaded
method. Growth is measured after a warm-up (pipeline cache, allocator pools, lazy imports).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from anywhere

from bench.load_destroy import RSS_SLACK_MB, live_wgpu_objects, rss_mb, settle  # noqa: E402
from delegate.aot import lower  # noqa: E402
from delegate.models import MLP, seeded  # noqa: E402
from delegate.runtime import Runtime  # noqa: E402

WARMUP = 5


def small_pte() -> tuple:
    x = torch.randn(5, 13)
    dims = {"x": {0: torch.export.Dim("batch", min=1, max=8)}}
    return lower(seeded(MLP()), (x,), dynamic_shapes=dims, device="webgpu").buffer, x


def _cycle(pte: bytes, device: str, x) -> None:
    prog = Runtime.get().load_program(pte, device=device)
    try:
        prog.load_method("forward").execute([x])
    finally:
        prog.destroy()


def _measure(step, n: int, every: int, label: str, gpu: bool) -> dict:
    """Run step() n times after a warm-up; growth of RSS and of each live wgpu object kind."""
    for _ in range(WARMUP):
        step()
    _settle(gpu)
    rss0, objs0 = rss_mb(), _objects(gpu)
    for i in range(1, n + 1):
        step()
        if i % every == 0 or i == n:
            _settle(gpu)
            print(f"{label:<24} {i:6d}  rss {rss_mb():8.1f} MB (+{rss_mb() - rss0:5.1f})",
                  flush=True)
    _settle(gpu)
    objs1 = _objects(gpu)
    grown = {k: (objs0.get(k, 0), v) for k, v in objs1.items() if v > objs0.get(k, 0)}
    return {"label": label, "rss_growth_mb": rss_mb() - rss0, "objects_grown": grown}


def _objects(gpu: bool) -> dict:
    if not gpu:
        return {}
    live = live_wgpu_objects()
    return {**{f"py {k}": v for k, v in live["py"].items()}, **live["native"]}


def _settle(gpu: bool) -> None:
    if gpu:
        settle()
    else:
        import gc

        gc.collect()


def soak(device: str, cycles: int, executes: int, every: int) -> list:
    pte, x = small_pte()
    gpu = device == "webgpu"
    reports = [_measure(lambda: _cycle(pte, device, x), cycles, max(1, cycles // every),
                        f"{device} load/destroy", gpu)]
    prog = Runtime.get().load_program(pte, device=device)
    method = prog.load_method("forward")
    reports.append(_measure(lambda: method.execute([x]), executes, max(1, executes // every),
                            f"{device} execute", gpu))
    prog.destroy()
    return reports


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--executes", type=int, default=3000)
    ap.add_argument("--devices", nargs="+", default=["cpu", "webgpu"], choices=["cpu", "webgpu"])
    ap.add_argument("--rows", type=int, default=5, help="progress rows per phase")
    args = ap.parse_args()
    failed = False
    for device in args.devices:
        for r in soak(device, args.cycles, args.executes, args.rows):
            grew = r["rss_growth_mb"] >= RSS_SLACK_MB or r["objects_grown"]
            failed |= bool(grew)
            print(f"{r['label']:<24} rss growth {r['rss_growth_mb']:+.1f} MB (slack "
                  f"{RSS_SLACK_MB:.0f}); wgpu objects grown: {r['objects_grown'] or 'none'}"
                  f"  {'GREW' if grew else 'flat'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

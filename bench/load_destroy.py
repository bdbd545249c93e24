"""Load and destroy a WebGPU-executed model N times; process RSS and live wgpu objects must
stay flat. Prints a row every `--every` cycles and exits non-zero if either grew.

    python bench/load_destroy.py --cycles 1000
"""
from __future__ import annotations

import argparse
import gc
import os
import sys

import torch

from delegate.ir import Graph, Node, SymExpr, SymbolBinding, TensorValue

RSS_SLACK_MB = 16.0   # allocator noise; a leak of one model per cycle shows far above this


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def live_wgpu_objects() -> dict:
    """wgpu-py objects alive in Python and wgpu-native objects still held, by kind."""
    import wgpu

    py = {k: v["count"] for k, v in wgpu.diagnostics.object_counts.get_dict().items()
          if k != "total"}
    native = {k: v["count"] for k, v in wgpu.diagnostics.wgpu_native_counts.get_dict().items()
              if isinstance(v, dict) and "count" in v}
    return {"py": py, "native": native}


def block_graph(dim: int = 32, hidden: int = 64, max_seq: int = 16) -> tuple:
    """An IR graph of one pre-norm MLP block with a dynamic sequence: (graph, weights)."""
    g, weights = Graph(), {}
    seq = SymExpr("s0")

    def act(*dims):
        return g.add_value(TensorValue(torch.float32, dims, tuple(
            max_seq if isinstance(d, SymExpr) else d for d in dims)))

    def weight(name, *shape):
        weights[name] = torch.randn(*shape) * 0.1
        return g.add_value(TensorValue(torch.float32, shape, shape, name))

    x = act(seq, dim)
    g.inputs, g.symbols = [x], [SymbolBinding("s0", 0, 0)]
    h, up, gate, out = act(seq, dim), act(seq, hidden), act(seq, hidden), act(seq, dim)
    probs = act(seq, dim)
    g.nodes += [
        Node("rms_norm", [x, weight("norm", dim)], [h], {"normalized_shape": [dim], "eps": 1e-6}),
        Node("linear", [h, weight("w_up", hidden, dim), weight("b_up", hidden)], [up], {}),
        Node("silu", [up], [gate], {}),
        Node("linear", [gate, weight("w_down", dim, hidden), -1], [out], {}),
        Node("softmax", [out], [probs], {"dim": -1}),
    ]
    g.outputs = [probs]
    return g, weights


def cycle(graph, weights, x) -> None:
    from delegate.runtime.webgpu_executor import WebGpuExecutor

    ex = WebGpuExecutor(graph, weights)
    try:
        ex.execute([x])
    finally:
        ex.destroy()


def settle() -> None:
    """Let Python drop the wrappers and wgpu-native free what they released."""
    from kernels_wgsl.device import get_device

    gc.collect()
    get_device().device._poll()  # wgpu-native frees released resources on maintain


def run(cycles: int, every: int, out=sys.stdout) -> tuple:
    """(rss growth MB, wgpu objects before, after) over `cycles` after a warm-up."""
    graph, weights = block_graph()
    x = torch.randn(5, 32)
    for _ in range(5):   # warm-up: pipeline cache, allocator pools, lazy imports
        cycle(graph, weights, x)
    settle()
    rss0, objs0 = rss_mb(), live_wgpu_objects()
    for i in range(1, cycles + 1):
        cycle(graph, weights, x)
        if i % every == 0 or i == cycles:
            settle()
            print(f"cycle {i:5d}  rss {rss_mb():8.1f} MB  (+{rss_mb() - rss0:.1f})", file=out)
    settle()
    return rss_mb() - rss0, objs0, live_wgpu_objects()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--every", type=int, default=100)
    args = ap.parse_args()
    grew, before, after = run(args.cycles, args.every)
    changed = {k: (before["native"].get(k), v) for k, v in after["native"].items()
               if v != before["native"].get(k)}
    changed.update({f"py {k}": (before["py"].get(k), v) for k, v in after["py"].items()
                    if v != before["py"].get(k)})
    print(f"rss growth {grew:.1f} MB over {args.cycles} cycles; wgpu objects changed: "
          f"{changed or 'none'}")
    return 0 if grew < RSS_SLACK_MB and not changed else 1


if __name__ == "__main__":
    sys.exit(main())

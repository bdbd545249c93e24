"""Lowering time against graph size: is it linear in the node count?

    python bench/lowering_time.py [--models chain,split,stack] [--sizes 250,500,1000,2000]
                                  [--runs 2] [--device cpu] [--cbp]

Each model is built at each size (about that many call nodes in the exported program, which
is what `nodes` counts), exported with a dynamic sequence length, then lowered with
`to_edge_transform_and_lower(ep, partitioner=[WgpuPartitioner(device)])`:

- chain: x [1, T, 16] through a chain of elementwise ops (add, mul, relu, neg, ...): one
  delegate call.
- split: the same chain with an op we do not claim (erfinv) every 25 nodes: one delegate call
  per stretch, so the partition count grows with the size too.
- stack: TinyTransformer (rms_norm, causal SDPA, SwiGLU) with as many layers as the size asks.

Printed per row: the seconds of the export (not part of lowering), of the whole lowering and
of its stages: `edge` (ExecuTorch: the decompositions, the edge dialect passes, creating the
partitions' submodules), `partition` (our WgpuPartitioner.partition) and `preprocess` (our
WgpuBackend.preprocess, all partitions); then the lowering's seconds per node. Every time is
the minimum of --runs runs (the machine is shared and noisy). Linear growth shows as a flat
s/node column.

--cbp partitions with torch's CapabilityBasedPartitioner (and the folded-node pruning the
partitioner had before it grouped by levels) instead of propose_partitions, for comparison.
"""
from __future__ import annotations

import argparse
import contextlib
import operator
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower  # noqa: E402

from delegate import partitioner as part_mod  # noqa: E402
from delegate import preprocess as pre_mod  # noqa: E402
from delegate.models import TinyTransformer, seeded  # noqa: E402

_UNARY = (torch.relu, torch.neg, torch.sigmoid, torch.tanh)


class Chain(torch.nn.Module):
    """n elementwise ops in a chain; with `every`, an erfinv (not claimed) every `every` ops."""

    def __init__(self, n: int, every: int = 0):
        super().__init__()
        self.n, self.every = n, every

    def forward(self, x):
        for i in range(self.n):
            if self.every and i % self.every == self.every - 1:
                x = torch.erfinv(torch.tanh(x) * 0.5)
            elif i % 3 == 0:
                x = x * 0.5 + 0.25
            else:
                x = _UNARY[i % len(_UNARY)](x)
        return x


def _build(model: str, size: int):
    """(module, example inputs, dynamic shapes) with about `size` exported call nodes."""
    seq = torch.export.Dim("seq", min=2, max=64)
    if model in ("chain", "split"):
        x = torch.randn(1, 8, 16)
        ops = max(1, round(size * 3 / 4))   # every third op is two nodes (x * a + b)
        return Chain(ops, every=25 if model == "split" else 0), (x,), ({1: seq},)
    if model == "stack":
        layers = max(1, round((size - 4) / _STACK_NODES_PER_LAYER))
        m = seeded(TinyTransformer(vocab=61, dim=32, heads=2, layers=layers, hidden=48))
        return m, (torch.randint(0, 61, (1, 8)),), ({1: seq},)
    raise SystemExit(f"--models: expected chain, split or stack, got {model!r}")


_STACK_NODES_PER_LAYER = 22   # call nodes per TinyTransformer layer in the exported program


class _Timer:
    """Wraps WgpuPartitioner.partition and WgpuBackend.preprocess; sums their seconds."""

    def __init__(self):
        self.partition = self.preprocess = 0.0

    @contextlib.contextmanager
    def installed(self):
        part_cls, back_cls = part_mod.WgpuPartitioner, pre_mod.WgpuBackend
        orig_part, orig_pre = part_cls.partition, back_cls.__dict__["preprocess"]

        def partition(inner, ep):
            t = time.perf_counter()
            try:
                return orig_part(inner, ep)
            finally:
                self.partition += time.perf_counter() - t

        def preprocess(ep, specs):
            t = time.perf_counter()
            try:
                return orig_pre.__func__(ep, specs)
            finally:
                self.preprocess += time.perf_counter() - t

        part_cls.partition = partition
        back_cls.preprocess = staticmethod(preprocess)
        try:
            yield self
        finally:
            part_cls.partition = orig_part
            back_cls.preprocess = orig_pre


@contextlib.contextmanager
def _cbp_partitioning():
    """propose_partitions replaced by torch's CapabilityBasedPartitioner + the old pruning."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    def prune(partitions):
        kept = []
        for part in partitions:
            nodes = set(part.nodes)
            changed = True
            while changed:
                changed = False
                for n in list(nodes):
                    if (part_mod._is_folded(n) and any(u not in nodes for u in n.users)) or \
                            (n.target is operator.getitem and n.args[0] not in nodes):
                        nodes.discard(n)
                        changed = True
            if any(not part_mod._is_folded(n) for n in nodes):
                kept.append(nodes)
        return kept

    def propose(graph, support):
        return prune(CapabilityBasedPartitioner(graph.owning_module, support,
                                                allows_single_node_partition=True)
                     .propose_partitions())

    orig = part_mod.propose_partitions
    part_mod.propose_partitions = propose
    try:
        yield
    finally:
        part_mod.propose_partitions = orig


def measure(model: str, size: int, device: str, runs: int) -> dict:
    best: dict = {}
    for _ in range(runs):
        module, inputs, dyn = _build(model, size)
        t0 = time.perf_counter()
        ep = torch.export.export(module, inputs, dynamic_shapes=dyn)
        t1 = time.perf_counter()
        nodes = sum(1 for n in ep.graph.nodes if n.op == "call_function")
        with _Timer().installed() as timer:
            t2 = time.perf_counter()
            edge = to_edge_transform_and_lower(
                ep, partitioner=[part_mod.WgpuPartitioner(device=device)],
                compile_config=EdgeCompileConfig(_check_ir_validity=False))
            t3 = time.perf_counter()
        gm = edge.exported_program().graph_module
        calls = sum(1 for n in gm.graph.nodes if n.op == "call_function"
                    and "executorch_call_delegate" in str(n.target))
        row = {"nodes": nodes, "calls": calls, "export": t1 - t0, "lower": t3 - t2,
               "partition": timer.partition, "preprocess": timer.preprocess,
               "edge": (t3 - t2) - timer.partition - timer.preprocess}
        for k, v in row.items():
            best[k] = v if k in ("nodes", "calls") else min(best.get(k, v), v)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="chain,split,stack")
    ap.add_argument("--sizes", default="250,500,1000,2000")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=("cpu", "webgpu"))
    ap.add_argument("--cbp", action="store_true",
                    help="partition with torch's CapabilityBasedPartitioner, for comparison")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'model':<6} {'nodes':>6} {'calls':>5} {'export s':>9} {'lower s':>8} {'edge s':>8} "
          f"{'partition s':>11} {'preprocess s':>12} {'ms/node':>8}")
    with _cbp_partitioning() if args.cbp else contextlib.nullcontext():
        for model in args.models.split(","):
            for size in sizes:
                r = measure(model, size, args.device, args.runs)
                print(f"{model:<6} {r['nodes']:>6} {r['calls']:>5} {r['export']:>9.2f} "
                      f"{r['lower']:>8.2f} {r['edge']:>8.2f} {r['partition']:>11.3f} "
                      f"{r['preprocess']:>12.3f} {1e3 * r['lower'] / r['nodes']:>8.2f}",
                      flush=True)


if __name__ == "__main__":
    main()

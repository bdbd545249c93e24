"""Memory planning by liveness: values whose lives overlap never share bytes.

Both executors plan once per load at the upper-bound shapes: the CPU executor carves one arena,
the WebGPU executor assigns storage buffers. Lives are inclusive node-index intervals, so a
node's outputs never overlap its own inputs, and graph outputs and states' new values live to
the end (the end of an execute reads them), so no later node can overwrite them.
"""
from __future__ import annotations

from dataclasses import dataclass

from delegate.ir import Graph, TensorValue


@dataclass(frozen=True)
class Interval:
    first: int
    last: int

    def overlaps(self, other: "Interval") -> bool:
        return self.first <= other.last and other.first <= self.last


def lifetimes(graph: Graph) -> dict:
    """value id -> Interval, for every non-constant tensor value the graph produces or takes."""
    n = len(graph.nodes)
    first, last = {}, {}
    for vid in graph.inputs:
        first[vid] = last[vid] = -1
    for i, node in enumerate(graph.nodes):
        for vid in node.outputs:
            first.setdefault(vid, i)
            last[vid] = max(last.get(vid, i), i)
        for vid in node.inputs:
            if vid in first:
                last[vid] = max(last[vid], i)
    # graph outputs and the new values of states are read after the last node
    for vid in list(graph.outputs) + [u.value for u in graph.state_updates]:
        if vid in first:
            last[vid] = n
    return {
        v: Interval(first[v], last[v]) for v in first
        if isinstance(graph.values[v], TensorValue) and not graph.values[v].constant_key
    }


def in_place_roots(graph: Graph) -> dict:
    """value id -> the value whose buffer it is, for outputs of in-place ops (OpDef.in_place):
    a cache write's result is the cache."""
    from delegate import ops as registry

    root: dict = {}
    for node in graph.nodes:
        if registry.get_op(node.op).in_place:
            src = node.inputs[0]
            root[node.outputs[0]] = root.get(src, src)
    return root


def shared_lifetimes(graph: Graph, roots: dict) -> dict:
    """lifetimes(), with each value that shares its root's bytes (a view, an in-place
    result) folded into the root's interval and left out itself."""
    lives = lifetimes(graph)
    for vid, root in roots.items():
        if vid in lives and root in lives:
            a, b = lives.pop(vid), lives[root]
            lives[root] = Interval(min(a.first, b.first), max(a.last, b.last))
        lives.pop(vid, None)
    return lives


def plan_offsets(sizes: dict, lives: dict, alignment: int = 64) -> tuple:
    """Greedy best-fit: largest values first, each at the lowest offset free during its life.

    Returns ({value id: byte offset}, total bytes).
    """
    placed = []  # (offset, end, interval)
    offsets = {}
    for vid in sorted(sizes, key=lambda v: (-sizes[v], v)):
        size = _align(max(1, sizes[vid]), alignment)
        busy = sorted((o, e) for o, e, life in placed if life.overlaps(lives[vid]))
        offset = 0
        for o, e in busy:
            if offset + size <= o:
                break
            offset = max(offset, e)
        offsets[vid] = offset
        placed.append((offset, offset + size, lives[vid]))
    total = max((e for _, e, _ in placed), default=0)
    return offsets, total


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a

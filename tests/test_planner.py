"""The liveness planner: overlapping lives never share bytes; graph outputs are never reused."""
import random

import torch

from delegate.ir import Graph, Node, TensorValue
from delegate.runtime import planner


def _chain_graph(n_nodes: int, seed: int) -> Graph:
    """A random DAG: each node reads 1-2 earlier values and writes one new value."""
    rng = random.Random(seed)
    g = Graph()
    x = g.add_value(TensorValue(torch.float32, (rng.randint(1, 9),), (9,)))
    g.inputs = [x]
    live = [x]
    for _ in range(n_nodes):
        ins = rng.sample(live, min(len(live), rng.randint(1, 2)))
        size = rng.randint(1, 50)
        out = g.add_value(TensorValue(torch.float32, (size,), (size,)))
        g.nodes.append(Node("add", ins, [out]))
        live.append(out)
    g.outputs = rng.sample(live[1:], 2)
    return g


def _nbytes(g, vid):
    n = 4
    for s in g.values[vid].max_shape:
        n *= s
    return n


def test_values_with_overlapping_lives_never_share_bytes():
    for seed in range(20):
        g = _chain_graph(30, seed)
        lives = planner.lifetimes(g)
        sizes = {v: _nbytes(g, v) for v in lives}
        offsets, total = planner.plan_offsets(sizes, lives)
        for a in lives:
            for b in lives:
                if a < b and lives[a].overlaps(lives[b]):
                    ra = range(offsets[a], offsets[a] + sizes[a])
                    rb = range(offsets[b], offsets[b] + sizes[b])
                    assert not (set(ra) & set(rb)), (seed, a, b)
        assert total <= sum(-(-s // 64) * 64 for s in sizes.values())


def test_reuse_happens_when_lives_do_not_overlap():
    g = _chain_graph(30, 0)
    lives = planner.lifetimes(g)
    sizes = {v: _nbytes(g, v) for v in lives}
    _, total = planner.plan_offsets(sizes, lives)
    assert total < sum(-(-s // 64) * 64 for s in sizes.values())


def test_graph_outputs_live_past_every_node_so_no_later_write_reuses_them():
    g = _chain_graph(30, 3)
    lives = planner.lifetimes(g)
    for vid in g.outputs:
        assert lives[vid].last == len(g.nodes)


def test_a_node_output_never_shares_with_its_own_inputs():
    g = _chain_graph(30, 5)
    lives = planner.lifetimes(g)
    for node in g.nodes:
        for i in node.inputs:
            for o in node.outputs:
                assert lives[i].overlaps(lives[o])

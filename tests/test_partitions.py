"""How the partitioner groups the nodes it claims into delegate calls (issue #14).

End to end (export -> our partitioner -> .pte -> our runner, against eager): a graph whose
ops are all claimed is one delegate call, also when sizes it slices by are computed by SymInt
ops we do not claim (Qwen3-Next's pad length `(64 - T % 64) % 64`); an unclaimed op in the
middle costs exactly the calls it must.

On fx graphs with a stand-in op set (`add` claimed, `sub` not, `mul` claimed and folded:
running no kernel, like a sym_size or a host-known arange): the grouping is never cyclic,
keeps every folded node with all its users, and reaches the least number of partitions. Two
of those graphs are ones on which torch's CapabilityBasedPartitioner, with the pruning of
folded nodes the partitioner used to run after it, splits needlessly or cycles.
"""
import math
import operator
import random

import pytest
import torch
import torch.fx as fx
from torch import nn

from delegate.aot import lower, undelegated_ops
from delegate.partitioner import propose_partitions
from tests.test_models import DEVICES, run_pte
from tests.tolerances import tol


def _delegate_calls(pm) -> int:
    gm = pm.exported_program().graph_module
    return sum(1 for n in gm.graph.nodes if n.op == "call_function"
               and "executorch_call_delegate" in str(n.target))


def _outside(pm) -> list:
    """The call nodes left to the runner (delegate calls and their getitems aside)."""
    gm = pm.exported_program().graph_module
    skip = ("executorch_call_delegate", "getitem")
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and not any(s in str(n.target) for s in skip)]


def _check_matches_eager(pm, model, inputs_list, device):
    for inputs, got in zip(inputs_list, run_pte(pm, inputs_list, device)):
        with torch.no_grad():
            want = model(*inputs)
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, **tol("model", device))


# ---- end to end -----------------------------------------------------------------------------

class PaddedChunks(nn.Module):
    """Qwen3-Next's chunked linear attention computes its pad length on the host:
    `T % 4` is an `operator.mod` node we do not claim, read by nothing but size arithmetic.
    Every tensor op here is claimed, so nothing may cut the graph in two."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):                       # x [1, T, 8], T >= 8
        t = x.shape[1]
        h = torch.relu(self.proj(x)) * 2.0 + 1.0
        n = t - t % 4                           # the whole chunks
        chunks = h[:, :n].reshape(1, n // 4, 4, 8).sum(2)
        return chunks * torch.sigmoid(h[:, :n:4]), h.mean(1)


@pytest.mark.parametrize("device", DEVICES)
def test_claimed_graph_slicing_by_host_size_arithmetic_is_one_delegate_call(device):
    torch.manual_seed(0)
    model = PaddedChunks().eval()
    # AUTO, as for Qwen3-Next: a named Dim would have to prove the reshape's guards itself
    t = torch.export.Dim.AUTO(min=8, max=64)
    pm = lower(model, (torch.randn(1, 13, 8),), dynamic_shapes=({1: t},), device=device)
    assert _delegate_calls(pm) == 1
    # left outside: only sizes (sym_size, mod), which the runner knows before any delegate
    assert all(isinstance(n.meta.get("val"), torch.SymInt) for n in _outside(pm)), \
        [str(n.target) for n in _outside(pm)]
    _check_matches_eager(pm, model, [(torch.randn(1, t, 8),) for t in (8, 13, 30)], device)


class Branches(nn.Module):
    """Independent subgraphs (no data path between them) and several outputs."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x, y):
        p = torch.nn.functional.gelu(self.a(x))
        q = torch.softmax(self.b(x), -1)
        r = torch.tanh(y) * 0.5
        return p + x, q, r - 1.0


@pytest.mark.parametrize("device", DEVICES)
def test_independent_claimed_subgraphs_share_one_delegate_call(device):
    torch.manual_seed(0)
    model = Branches().eval()
    x, y = torch.randn(4, 6), torch.randn(5)
    pm = lower(model, (x, y), device=device)
    assert _delegate_calls(pm) == 1
    assert [t for t in undelegated_ops(pm) if "alloc" not in t] == []
    _check_matches_eager(pm, model, [(x, y)], device)


class Unclaimed(nn.Module):
    """`erfinv` (not in our op set) on `chains` paths; the paths run side by side."""

    def __init__(self, chains: int, depth: int):
        super().__init__()
        self.depth = depth
        self.lins = nn.ModuleList(nn.Linear(8, 8) for _ in range(chains * (depth + 1)))

    def forward(self, x):
        outs = []
        for c in range(len(self.lins) // (self.depth + 1)):
            h = x
            for d in range(self.depth + 1):
                if d:
                    h = torch.erfinv(torch.tanh(h) * 0.5)   # leaves the delegate, comes back
                h = self.lins[c * (self.depth + 1) + d](h)
            outs.append(h)
        return sum(outs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chains,depth", [(2, 1), (1, 3)])
def test_unclaimed_op_in_the_middle_costs_exactly_the_calls_it_must(chains, depth, device):
    """`depth` erfinvs on one path: depth + 1 stretches, none of which can share a call with
    another; parallel paths share each stretch's call with their twins."""
    torch.manual_seed(0)
    model = Unclaimed(chains, depth).eval()
    x = torch.randn(3, 8)
    pm = lower(model, (x,), device=device)
    assert _delegate_calls(pm) == depth + 1
    outside = [t for t in undelegated_ops(pm) if "alloc" not in t]   # memory planning's
    assert outside == ["aten.erfinv.out"] * (chains * depth)
    _check_matches_eager(pm, model, [(x,)], device)


# ---- the grouping itself, on fx graphs ------------------------------------------------------

class _StandIn:
    """The op set propose_partitions asks about: add claimed, mul claimed and folded,
    anything else unclaimed."""

    def is_node_supported(self, submodules, node) -> bool:
        return node.op == "call_function" and node.target in (torch.add, torch.mul)

    def is_folded(self, node) -> bool:
        return node.target is torch.mul


def _graph(spec: list, outputs: list) -> fx.Graph:
    """spec: (name, fn, arg names) in order; placeholders x and y are there already."""
    g = fx.Graph()
    env = {"x": g.placeholder("x"), "y": g.placeholder("y")}
    for name, fn, args in spec:
        env[name] = g.call_function(fn, tuple(env[a] for a in args))
        env[name].name = name
    g.output(tuple(env[o] for o in outputs))
    return g


def _tags(partitions) -> dict:
    return {n: i for i, part in enumerate(partitions) for n in part}


def _acyclic(graph: fx.Graph, tags: dict) -> bool:
    """No partition waits on its own output: the graph with each partition collapsed to one
    vertex has a topological order."""
    vertex = {n: ("p", tags[n]) if n in tags else ("n", n) for n in graph.nodes}
    succ = {v: set() for v in vertex.values()}
    for n in graph.nodes:
        for u in n.users:
            if vertex[u] != vertex[n]:
                succ[vertex[n]].add(vertex[u])
    indeg = {v: 0 for v in succ}
    for v in succ:
        for w in succ[v]:
            indeg[w] += 1
    ready, seen = [v for v, d in indeg.items() if d == 0], 0
    while ready:
        v = ready.pop()
        seen += 1
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return seen == len(succ)


def _check_valid(graph, partitions):
    tags = _tags(partitions)
    assert _acyclic(graph, tags)
    for n in graph.nodes:
        if n.op == "call_function" and n.target is torch.add:
            assert n in tags, f"{n.name}: claimed compute node in no partition"
        if n in tags and n.target is torch.mul:   # folded: no delegate hands it over
            assert all(tags.get(u) == tags[n] for u in n.users), n.name
        if n.op == "call_function" and n.target is torch.sub:
            assert n not in tags


def _cbp_with_old_pruning(graph) -> list:
    """What the partitioner did before: torch's CapabilityBasedPartitioner, then folded nodes
    dropped from partitions that do not hold all their users."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node):
            return _StandIn().is_node_supported(submodules, node)

    gm = fx.GraphModule(nn.Module(), graph)
    out = []
    for part in CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True) \
            .propose_partitions():
        nodes = set(part.nodes)
        changed = True
        while changed:
            changed = False
            for n in list(nodes):
                if n.target is torch.mul and any(u not in nodes for u in n.users):
                    nodes.discard(n)
                    changed = True
        if any(n.target is not torch.mul for n in nodes):
            out.append(nodes)
    return out


def test_folded_node_behind_an_unclaimed_op_cuts_nothing():
    # m3 is folded (a size of what the unclaimed s1 computed) and feeds only the output: it
    # stays outside. CapabilityBasedPartitioner first merged it into a1's partition, so a0
    # (upstream of s1) could not join that partition, and pruning m3 later left two calls.
    g = _graph([("a0", torch.add, "yy"), ("s1", torch.sub, ["a0", "a0"]),
                ("s2", torch.sub, ["s1", "a0"]), ("m1", torch.mul, "xy"),
                ("m2", torch.mul, ["x", "m1"]), ("m3", torch.mul, ["y", "s1"]),
                ("a1", torch.add, ["m2", "y"])], ["s2", "m3", "a1"])
    parts = propose_partitions(g, _StandIn())
    _check_valid(g, parts)
    assert len(parts) == 1
    assert {n.name for n in parts[0]} == {"a0", "m1", "m2", "a1"}
    assert len(_cbp_with_old_pruning(g)) == 2


def test_folded_node_read_inside_and_outside_is_left_out_without_a_cycle():
    # m0 folds a0's result (a sym_size of an intermediate), read by a1 (claimed) and by s0
    # (not). Left outside, it makes a0 -> m0 -> a1 a path through the runner, so a0 and a1
    # need two calls. Pruning m0 out of CapabilityBasedPartitioner's single partition instead
    # gave one partition that waits on itself.
    g = _graph([("a0", torch.add, "xy"), ("m0", torch.mul, ["x", "a0"]),
                ("a1", torch.add, ["m0", "x"]), ("s0", torch.sub, ["m0", "a1"])], ["s0"])
    parts = propose_partitions(g, _StandIn())
    _check_valid(g, parts)
    assert [sorted(n.name for n in p) for p in parts] == [["a0"], ["a1"]]
    old = _cbp_with_old_pruning(g)
    assert len(old) == 1 and not _acyclic(g, _tags(old))


def test_host_side_folded_node_joins_its_users_or_stays_outside():
    # m0 (host-side: reads only inputs) has both users in one partition: it joins them. m1's
    # users sit on both sides of the unclaimed s0: it stays with the runner.
    g = _graph([("m0", torch.mul, "xy"), ("m1", torch.mul, "yy"), ("a0", torch.add, ["x", "m0"]),
                ("a1", torch.add, ["a0", "m0"]), ("a2", torch.add, ["a1", "m1"]),
                ("s0", torch.sub, ["a2", "x"]), ("a3", torch.add, ["s0", "m1"])], ["a3"])
    parts = propose_partitions(g, _StandIn())
    _check_valid(g, parts)
    assert [sorted(n.name for n in p) for p in parts] == [["a0", "a1", "a2", "m0"], ["a3"]]


def test_getitem_goes_with_the_tuple_it_reads():
    g = fx.Graph()
    x = g.placeholder("x")
    pair = g.call_function(torch.add, (x, x))      # stands for a claimed tuple-valued op
    first, second = (g.call_function(operator.getitem, (pair, i)) for i in (0, 1))
    out = g.call_function(torch.sub, (first, x))
    g.output((g.call_function(torch.add, (out, second)),))
    parts = propose_partitions(g, _StandIn())
    assert len(parts) == 2 and {pair, first, second} <= parts[0]


def _least_partitions(graph) -> int:
    """The largest number of claimed stretches some path passes through, separated by
    unclaimed nodes (host-side folded nodes count as inputs): no grouping has fewer."""
    best, left = {}, {}   # claimed: stretches up to and including it; unclaimed: before it
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        ins = n.all_input_nodes
        if n.target is torch.add:
            best[n] = max([1] + [best[p] if p in best else left.get(p, 0) + 1 for p in ins])
        else:   # unclaimed, or folded and host-side (the property test only builds those)
            left[n] = max([0] + [best.get(p, left.get(p, 0)) for p in ins])
    return max(best.values(), default=0)


def _random_graph(rng, host_side_folds: bool) -> fx.Graph:
    g = fx.Graph()
    nodes = [g.placeholder("x"), g.placeholder("y")]
    host = set(nodes)
    for _ in range(rng.randint(3, 30)):
        c = rng.random()
        if c < 0.3:
            pool = [n for n in nodes if n in host] if host_side_folds else nodes
            a, b = rng.choice(pool), rng.choice(pool)
            m = g.call_function(torch.mul, (a, b))
            if a in host and b in host:
                host.add(m)
        else:
            a, b = rng.choice(nodes[-rng.choice([2, 4, 30]):]), rng.choice(nodes)
            m = g.call_function(torch.sub if c < 0.5 else torch.add, (a, b))
        nodes.append(m)
    g.output(tuple(n for n in nodes[2:] if not n.users) or (nodes[-1],))
    return g


@pytest.mark.parametrize("host_side_folds", [True, False])
def test_random_graphs_get_valid_partitions_and_the_least_number(host_side_folds):
    rng = random.Random(14)
    for _ in range(400):
        g = _random_graph(rng, host_side_folds)
        parts = propose_partitions(g, _StandIn())
        _check_valid(g, parts)
        if host_side_folds:
            assert len(parts) == _least_partitions(g), g


def test_grouping_time_grows_linearly():
    """A chain of 20k nodes with an unclaimed node every 8 (2500 partitions) takes about ten
    times a 2k chain's time, not a hundred (quadratic). Both are well under a second on a
    2-core machine; the ratio bound is loose for a shared, noisy one."""
    import time

    def chain(n):
        g = fx.Graph()
        h = g.placeholder("x")
        for i in range(n):
            h = g.call_function(torch.sub if i % 8 == 7 else torch.add, (h, h))
        g.output((h,))
        return g

    def best_of(g, runs=3):
        out = math.inf
        for _ in range(runs):
            t = time.perf_counter()
            propose_partitions(g, _StandIn())
            out = min(out, time.perf_counter() - t)
        return out

    small, large = chain(2000), chain(20000)
    assert len(propose_partitions(large, _StandIn())) == 2500
    assert best_of(large) / best_of(small) < 30

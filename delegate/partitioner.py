"""WgpuPartitioner: claims the nodes the op registry supports on the chosen device.

`is_node_supported` and `ops_to_not_decompose` read the same registry and the same support
check, so every node kept from decomposition is a node we claim (to_edge_transform_and_lower
raises on a kept node nobody claims).

The claimed nodes are grouped by `propose_partitions` (levels, in time linear in the graph),
not by torch's CapabilityBasedPartitioner: see there for why.
"""
from __future__ import annotations

import logging
import math
import operator
from collections import Counter
from typing import Optional

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data, tag_mutated_buffer
from torch.fx.passes.operator_support import OperatorSupportBase

from delegate import host_values
from delegate import ops as registry
from delegate.ops import export
from delegate import passes as graph_passes
from delegate import preprocess  # noqa: F401  (ExecuTorch finds WgpuBackend among loaded BackendDetails)
from delegate.errors import DelegateError
from delegate.lowering import constant_inputs, constant_keys, upper_bounds
from delegate.ops._common import claiming_for

log = logging.getLogger("etwgpu")
DEVICES = ("webgpu", "cpu")
BACKEND_ID = "WgpuBackend"


def kernel_exists(op_name: str, device: str) -> bool:
    if device == "cpu":
        import kernels_cpu

        return kernels_cpu.has_kernel(op_name)
    import kernels_wgsl

    return kernels_wgsl.has_kernel(op_name)


class RegistrySupport(OperatorSupportBase):
    """Node support from the op registry; remembers why each unsupported node was rejected."""

    def __init__(self, device: str, upper_bounds: dict):
        self.device = device
        self.upper_bounds = upper_bounds
        self.rejected: Counter = Counter()
        self._folded: dict = {}   # node -> _is_folded(node), asked once per node

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        reason = self.reason(node)
        if reason is not None and node.op == "call_function":
            self.rejected[f"{export.target_name(node.target)}: {reason}"] += 1
        return reason is None

    def is_folded(self, node: torch.fx.Node) -> bool:
        if node not in self._folded:
            self._folded[node] = _is_folded(node)
        return self._folded[node]

    def reason(self, node: torch.fx.Node) -> Optional[str]:
        if node.op != "call_function":
            return "not a call"
        if node.target is operator.getitem:
            # an element of a claimed tuple (batch_norm's y) stays in its producer's partition;
            # rejecting it would cut the partition at every tuple-valued op
            return self.reason(node.args[0])
        if host_values.host_only(node):
            return None   # a position or index range: folded into attributes at lowering
        pattern = export.pattern_for(node)
        if pattern is not None and kernel_exists(pattern.name, self.device):
            return None
        op = export.op_for_target(node.target)
        if op is None:
            return "; ".join(["no op registered", *export.pattern_rejections(node)])
        if not op.folded and not kernel_exists(op.name, self.device):
            return f"no {self.device} kernel"
        why = self._check_values(op, node)
        if why is None and op.check is not None:
            with claiming_for(self.device):
                why = op.check(node)
        return why

    def _check_values(self, op, node) -> Optional[str]:
        vals = node.meta.get("val")
        vals = vals if isinstance(vals, (list, tuple)) else [vals]
        for v in vals:
            if not isinstance(v, torch.Tensor):
                continue
            if op.dtypes and v.dtype not in op.dtypes:
                return f"dtype {v.dtype} not in {[str(d) for d in op.dtypes]}"
            for s in v.shape:
                if isinstance(s, torch.SymInt) and not self._bounded(s):
                    return f"dynamic size {s} has no upper bound"
        return None

    def _bounded(self, s: torch.SymInt) -> bool:
        syms = {str(x) for x in s.node.expr.free_symbols}
        return all(math.isfinite(self.upper_bounds.get(x, math.inf)) for x in syms)


class WgpuPartitioner(Partitioner):
    def __init__(self, device: str = "webgpu", passes: Optional[str] = None):
        """passes: the graph passes preprocess runs (delegate/passes), comma-separated names
        or "none"; None runs them all."""
        if device not in DEVICES:
            raise DelegateError(f"WgpuPartitioner device: expected one of {DEVICES}, got {device!r}")
        self.device = device
        specs = [CompileSpec("device", device.encode())]
        if passes is not None:
            specs.append(CompileSpec("passes", passes.encode()))
            graph_passes.enabled(specs)   # an unknown name fails here, not inside preprocess
        self.delegation_spec = DelegationSpec(BACKEND_ID, specs)
        self.last_rejections: Counter = Counter()
        self._real_constants: dict = {}   # state-dict key -> tensor, seen by ops_to_not_decompose
        super().__init__()

    def partition(self, exported_program) -> PartitionResult:
        support = RegistrySupport(self.device, upper_bounds(exported_program))
        gm = exported_program.graph_module
        # ExecuTorch passes a program with FakeTensor weights; value checks read the real ones
        constants = constant_inputs(exported_program, self._real_constants)
        with export.program_constants(constants):
            parts = propose_partitions(gm.graph, support)
        tags = {}
        for i, part in enumerate(parts):
            tag = f"etwgpu_{i}"
            for node in part:
                node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        _own_mutated_buffers(exported_program)
        self.last_rejections = support.rejected
        if support.rejected:
            log.info("etwgpu: not delegated: %s", dict(support.rejected))
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    def ops_to_not_decompose(self, ep):
        """ATen ops to keep whole (linear, SDPA, rms_norm, ...), and no per-node filter.

        An op is kept only when every one of its nodes in this program is one we will claim,
        so nothing kept is left unclaimed; otherwise all its nodes decompose and we claim the
        pieces. We return no filter on purpose: a filter sends ExecuTorch down its
        EDGE_DO_NOT_DECOMP path, whose re-trace gives a kept SDPA different output strides and
        then fails on the view that follows it (the usual `y.transpose(1, 2).reshape(...)`).
        """
        support = RegistrySupport(self.device, upper_bounds(ep))
        constants = constant_inputs(ep)
        keys = constant_keys(ep)
        self._real_constants.update({keys[name]: t for name, t in constants.items()})
        with export.program_constants(constants):
            return self._kept_ops(ep, support), None

    def _kept_ops(self, ep, support) -> list:
        by_target: dict = {}   # one pass over the graph, not one per op
        for n in ep.graph_module.graph.nodes:
            if n.op == "call_function":
                by_target.setdefault(n.target, []).append(n)
        keep = []
        for op in registry.all_ops().values():
            if not kernel_exists(op.name, self.device):
                continue
            for aten_op in filter(None, (_resolve_aten(name) for name in op.keep)):
                if all(support.reason(n) is None for n in by_target.get(aten_op, ())):
                    keep.append(aten_op)
        return keep


def _resolve_aten(name: str):
    ns, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload, None)


# How propose_partitions sees a call node.
_COMPUTE = "compute"    # claimed; runs a kernel
_FOLDED = "folded"      # claimed; runs no kernel (a size, a host-known index, an absorbed
                        # dequantize): inside a partition only together with all its users
_OUTSIDE = "outside"    # not claimed: the runner runs it through ATen
_INF = math.inf


def propose_partitions(graph: torch.fx.Graph, support: RegistrySupport) -> list:
    """The claimed nodes of `graph` grouped into as few delegate calls as their unsupported
    neighbours allow, in time linear in the graph: a list of node sets.

    Why not torch's CapabilityBasedPartitioner: it keeps every node's set of downstream nodes
    and, at every node, tries to merge every partition with every other (quadratic in the
    node count at best), and it sees a folded node (a sym_size, a host-known arange) as a
    member of the partition it merged it into. A size query that an unsupported SymInt op
    (`operator.mod`: a pad length) reads then "depends" on that partition, so everything
    downstream of the pad length is cut off from it, though the size is known on the host
    before any delegate runs.

    Here every claimed compute node gets a level: the most unsupported nodes that some path
    from the program's inputs to it leaves the claimed nodes through (a path that leaves
    and re-enters counts once). Nodes of one level form one partition: no path between two
    of them leaves the partition (it would raise the later one's level), so a partition
    never waits on its own output through the runner. The largest level + 1 is also the
    least number of partitions any grouping can have: the path that sets it passes through
    claimed nodes of every lower level, and no two of them can share a partition. A node is
    then moved as late as its users allow (the ALAP level), so that a weight's permute or a
    mask built from the positions lands with the node that reads it, not in an earlier
    delegate that would hand it over.

    A folded node that reads nothing a partition computes (sizes, positions, host-known
    ranges: "host-side") constrains nobody: it joins its users' partition when they all
    share one, and otherwise stays outside for the runner, which knows its value before any
    delegate runs. A folded node that reads a partition's tensor (a sym_size of an
    intermediate) is placed like a compute node and must share a partition with all its
    users; where it cannot, it is left outside and the levels are computed again.
    """
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    kinds = {}
    for n in nodes:
        if n.target is operator.getitem:
            continue   # an element of a tuple goes where the tuple's producer goes
        if not support.is_node_supported(None, n):
            kinds[n] = _OUTSIDE
        else:
            kinds[n] = _FOLDED if support.is_folded(n) else _COMPUTE
    for n in nodes:
        if n.target is operator.getitem:
            support.is_node_supported(None, n)   # counts the rejections as before
    forced_out: set = set()
    while True:
        placement, conflicts = _place(nodes, kinds, forced_out)
        if not conflicts:
            break
        forced_out |= conflicts
    groups: dict = {}
    for n, level in placement.items():
        groups.setdefault(level, set()).add(n)
    return [groups[k] for k in sorted(groups)
            if any(kinds.get(_producer(n)) == _COMPUTE for n in groups[k])]


def _producer(n):
    while n.op == "call_function" and n.target is operator.getitem and \
            isinstance(n.args[0], torch.fx.Node):
        n = n.args[0]
    return n


def _place(nodes: list, kinds: dict, forced_out: set):
    """One pass of propose_partitions: (node -> level for every claimed node, the folded nodes
    that read a partition's tensor yet cannot share a partition with all their users)."""
    # role: "level" nodes sit in a partition at a level; "host" nodes (outside, or folded and
    # host-side) are run by the runner unless a folded one joins its users later.
    role, asap, reach = {}, {}, {}

    def need(p) -> int:
        """The least level of a claimed node reading p."""
        p = _producer(p)
        if p not in role:
            return 0                       # a placeholder: a program input, weight, buffer
        if role[p] == "level":
            return asap[p]
        return reach[p] + 1 if reach[p] >= 0 else 0

    def feeds(p) -> int:
        """The highest level whose partition output an unclaimed node reading p waits on."""
        p = _producer(p)
        if p not in role:
            return -1
        return asap[p] if role[p] == "level" else reach[p]

    for n in nodes:
        if n.target is operator.getitem:
            continue
        inputs = n.all_input_nodes
        kind = kinds[n]
        if kind == _FOLDED and n not in forced_out:
            r = max((feeds(p) for p in inputs), default=-1)
            if r < 0:
                role[n], reach[n] = "host", -1       # host-side: constrains nobody
                continue
            kind = _COMPUTE
        if kind == _COMPUTE:
            role[n] = "level"
            asap[n] = max((need(p) for p in inputs), default=0)
        else:
            role[n] = "host"
            reach[n] = max((feeds(p) for p in inputs), default=-1)
    if not asap:
        return {}, set()
    top = max(asap.values())

    # ALAP: as late as the users allow. limit[n]: the level n may take at most (level nodes);
    # first[n]: the lowest level of a claimed node downstream of host node n through host
    # nodes only (inf when none).
    limit, first = {}, {}

    def bound(u) -> float:
        """The highest level a level node read by u may take."""
        if u.op != "call_function":
            return top                         # the output
        if u.target is operator.getitem:
            return min((bound(w) for w in u.users), default=top)
        if role[u] == "level":
            return limit[u]
        return first[u] - 1

    def reaches(u) -> float:
        if u.op != "call_function":
            return _INF
        if u.target is operator.getitem:
            return min((reaches(w) for w in u.users), default=_INF)
        return limit[u] if role[u] == "level" else first[u]

    for n in reversed(nodes):
        if n.target is operator.getitem:
            continue
        if role[n] == "level":
            limit[n] = max(asap[n], min([top, *(bound(u) for u in n.users)]))
        else:
            first[n] = min((reaches(u) for u in n.users), default=_INF)

    placement = {n: limit[n] for n in nodes if role.get(n) == "level"}
    lowest = min(placement.values())
    conflicts = set()
    for n in reversed(nodes):   # users before producers: a folded chain joins as a whole
        if n.target is operator.getitem:
            continue
        if kinds[n] != _FOLDED or n in forced_out:
            continue
        levels = {_user_level(u, placement) for u in n.users}
        if role[n] == "level":
            if n.users and levels != {placement[n]}:
                conflicts.add(n)
        elif len(levels) == 1 and None not in levels:
            placement[n] = levels.pop()
        elif not n.users:
            # a check on the positions (torch._check), which preprocess makes a Graph check:
            # it reads only host-side values, so any partition may hold it
            placement[n] = lowest
    for n in nodes:
        if n.target is operator.getitem and _producer(n) in placement:
            placement[n] = placement[_producer(n)]
    return placement, conflicts


def _user_level(u, placement: dict):
    """The partition level of a folded node's user, or None when it is not claimed."""
    if u.op != "call_function":
        return None
    if u.target is operator.getitem:
        levels = {_user_level(w, placement) for w in u.users}
        return levels.pop() if len(levels) == 1 else None
    return placement.get(u)


def _own_mutated_buffers(ep) -> None:
    """A buffer whose readers and whose new value are all in one partition becomes that
    delegate's resident state (ExecuTorch's tag_mutated_buffer); any other stays with the
    runner, which then writes it back after each execute."""
    from torch.export.graph_signature import OutputKind

    tag_mutated_buffer(ep)
    output = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
    new_value = {spec.target: arg for spec, arg in zip(ep.graph_signature.output_specs,
                                                       output.args[0])
                 if spec.kind == OutputKind.BUFFER_MUTATION}
    for name, target in ep.graph_signature.inputs_to_buffers.items():
        node = next((n for n in ep.graph_module.graph.nodes if n.name == name), None)
        tag = node.meta.get("delegation_tag") if node is not None else None
        if tag is None or target not in new_value:
            continue
        tags = {u.meta.get("delegation_tag") for u in node.users}
        value = new_value[target]
        if tags != {tag} or getattr(value, "meta", {}).get("delegation_tag") != tag:
            del node.meta["delegation_tag"]


def _is_folded(node) -> bool:
    if host_values.host_only(node):
        return True
    if node.op != "call_function" or export.pattern_for(node) is not None:
        return False
    op = export.op_for_target(node.target)
    return op is not None and op.folded

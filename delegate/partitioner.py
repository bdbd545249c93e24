"""WgpuPartitioner: claims the nodes the op registry supports on the chosen device.

`is_node_supported` and `ops_to_not_decompose` read the same registry and the same support
check, so every node kept from decomposition is a node we claim (to_edge_transform_and_lower
raises on a kept node nobody claims).
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
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
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

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        reason = self.reason(node)
        if reason is not None and node.op == "call_function":
            self.rejected[f"{export.target_name(node.target)}: {reason}"] += 1
        return reason is None

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
            proposed = CapabilityBasedPartitioner(
                gm, support, allows_single_node_partition=True
            ).propose_partitions()
            parts = _prune_symbolic(proposed)
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
        keep = []
        for op in registry.all_ops().values():
            if not kernel_exists(op.name, self.device):
                continue
            for aten_op in filter(None, (_resolve_aten(name) for name in op.keep)):
                nodes = [n for n in ep.graph_module.graph.nodes
                         if n.op == "call_function" and n.target == aten_op]
                if all(support.reason(n) is None for n in nodes):
                    keep.append(aten_op)
        return keep


def _resolve_aten(name: str):
    ns, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload, None)


def _prune_symbolic(partitions) -> list:
    """Keep folded nodes (size queries, weight dequantizes) only where all their users are in
    the same partition, and drop partitions left with no kernel to run: a delegate never
    returns a bare SymInt or a value no kernel produced."""
    kept = []
    for part in partitions:
        nodes = set(part.nodes)
        changed = True
        while changed:
            changed = False
            for n in list(nodes):
                if (_is_folded(n) and any(u not in nodes for u in n.users)) or \
                        (n.target is operator.getitem and n.args[0] not in nodes):
                    nodes.discard(n)
                    changed = True
        if any(not _is_folded(n) for n in nodes):
            kept.append(nodes)
    return kept


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

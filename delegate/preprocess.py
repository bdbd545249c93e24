"""WgpuBackend.preprocess: an edge subgraph -> our IR -> passes -> a FlatBuffers blob.

Weights are not in the blob: they go to the NamedDataStore keyed by sha256 (16-byte aligned),
so the .pte holds each weight once however many delegates use it.
"""
from __future__ import annotations

import operator
from typing import List

import torch

from executorch.exir._serialize._named_data_store import NamedDataStore
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec

from delegate import blob, host_values, passes
from delegate import ops as registry
from delegate.ops import export
from delegate.ops.creation import lower_host_tensor
from delegate.ops.export import target_name
from delegate.errors import UnsupportedError
from delegate.ir import Check, Graph, StateUpdate, SymExpr, in_place_ok, last_reads
from delegate.lowering import LoweringContext, constant_inputs, upper_bounds


class WgpuBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs: List[CompileSpec]) -> PreprocessResult:
        store = NamedDataStore()
        graph = lower_to_ir(edge_program, store, passes.enabled(compile_specs))
        return PreprocessResult(
            processed_bytes=blob.encode(graph),
            data_store_output=store.get_named_data_store_output(),
        )


def lower_to_ir(ep, named_data=None, pass_names=tuple(passes.PASSES)) -> Graph:
    """Walk the partition's graph in order; every call goes through its OpDef.lower, unless
    an enabled pass (delegate/passes) rewrote it. Buffers the partition mutates (tagged by
    the partitioner) become delegate-owned states; their new values, state updates."""
    graph = Graph()
    ctx = LoweringContext(graph, upper_bounds(ep), named_data)
    constants = constant_inputs(ep)
    states = mutated_buffers(ep)
    with export.program_constants(constants):
        rewrites = passes.rewrites(ep.graph_module.graph, pass_names)
        for node in ep.graph_module.graph.nodes:
            if node.op == "placeholder":
                if node.name in states:
                    ctx.bind_state(node, constants[node.name])
                elif node.name in constants:
                    ctx.defer_constant(node, constants[node.name])
                else:
                    ctx.bind_input(node)
            elif node.op == "call_function" and node.target is operator.getitem:
                continue  # ctx.tensor() maps getitem onto the tuple's element values
            elif node.op == "call_function" and node in rewrites:
                rewrites[node](ctx, node)
            elif node.op == "call_function":
                _lower_node(ctx, node)
            elif node.op == "output":
                _bind_outputs(ctx, ep, node, states)
    _drop_dead(graph)
    _demote_in_place(graph)
    return graph


def _drop_dead(graph: Graph) -> None:
    """Nodes whose results nothing reads (a mask the attention's kv_len replaced) emit no
    dispatch. Each node is pure but for in-place ops, whose output is their input's buffer."""
    live = set(graph.outputs) | {u.value for u in graph.state_updates}
    kept = []
    for node in reversed(graph.nodes):
        if any(v in live for v in node.outputs):
            kept.append(node)
            live.update(v for v in node.inputs if v != -1)
            for v in node.inputs:
                item = graph.values[v] if v != -1 else None
                live.update(getattr(item, "items", ()))
    graph.nodes = kept[::-1]


def mutated_buffers(ep) -> dict:
    """placeholder name -> buffer target, for the buffers this program's outputs mutate."""
    sig = ep.graph_signature
    targets = set(sig.buffers_to_mutate.values())
    return {name: t for name, t in sig.inputs_to_buffers.items() if t in targets}


def _bind_outputs(ctx: LoweringContext, ep, node, states: dict) -> None:
    """User outputs become graph outputs; a buffer mutation, an update of its state."""
    from torch.export.graph_signature import OutputKind

    by_target = {t: name for name, t in states.items()}
    placeholders = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    for spec, arg in zip(ep.graph_signature.output_specs, node.args[0]):
        if spec.kind == OutputKind.BUFFER_MUTATION and spec.target in by_target:
            state, value = ctx.tensor(placeholders[by_target[spec.target]]), ctx.tensor(arg)
            if state != value:
                ctx.graph.state_updates.append(StateUpdate(state, value))
        elif spec.kind == OutputKind.USER_OUTPUT:
            ctx.graph.outputs.append(ctx.tensor(arg))
        else:
            raise UnsupportedError(f"output {spec.arg.name}: expected a user output or a buffer "
                                   f"mutation, got {spec.kind.name}")


def _demote_in_place(graph: Graph) -> None:
    """An in-place op whose input 0 is read later becomes its functional twin (name without
    the trailing underscore): the lowering emits in-place ops before it knows the readers."""
    reads = last_reads(graph)
    for k, node in enumerate(graph.nodes):
        if registry.get_op(node.op).in_place and not in_place_ok(graph, k, reads):
            node.op = node.op[:-1]


def _lower_node(ctx: LoweringContext, node) -> None:
    """A host-known integer lowers to nothing (delegate/host_values.py) until a kernel reads
    it as a tensor (then an arange or a 0-d full, delegate/ops/creation.py); a matching
    pattern rooted here wins over the node's own op."""
    if host_values.host_only(node):
        host = host_values.value_of(node)
        if target_name(node.target) == "aten._local_scalar_dense.default":
            src = host_values.local_scalar_source(node)
            ctx.bind_value_symbol(node, src.source, src.index)
        elif isinstance(host, host_values.Assertion):
            ctx.graph.checks += [Check(SymExpr(str(e)), host.message)
                                 for e in host.condition.nonneg if not isinstance(e, int)]
        elif isinstance(host, (host_values.Range, host_values.Scalar)) and \
                isinstance(node.meta.get("val"), torch.Tensor):
            ctx.defer_lowering(node, lambda: lower_host_tensor(ctx, node, host))
        return
    pattern = export.pattern_for(node)
    if pattern is not None:
        return pattern.lower(ctx, node)
    op = export.op_for_target(node.target)
    if op is None:
        raise UnsupportedError(
            f"node {node.name}: expected a registered op, got {export.target_name(node.target)}"
        )
    op.lower(ctx, node)

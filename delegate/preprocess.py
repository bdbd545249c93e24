"""WgpuBackend.preprocess: an edge subgraph -> our IR -> passes -> a FlatBuffers blob.

Weights are not in the blob: they go to the NamedDataStore keyed by sha256 (16-byte aligned),
so the .pte holds each weight once however many delegates use it.
"""
from __future__ import annotations

import operator
from typing import List

from executorch.exir._serialize._named_data_store import NamedDataStore
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec

from delegate import blob, passes
from delegate.ops import export
from delegate.errors import UnsupportedError
from delegate.ir import Graph
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
    an enabled pass (delegate/passes) rewrote it."""
    graph = Graph()
    ctx = LoweringContext(graph, upper_bounds(ep), named_data)
    constants = constant_inputs(ep)
    with export.program_constants(constants):
        rewrites = passes.rewrites(ep.graph_module.graph, pass_names)
        for node in ep.graph_module.graph.nodes:
            if node.op == "placeholder":
                if node.name in constants:
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
                graph.outputs = [ctx.tensor(a) for a in node.args[0]]
    return graph


def _lower_node(ctx: LoweringContext, node) -> None:
    """A matching pattern rooted here wins over the node's own op."""
    pattern = export.pattern_for(node)
    if pattern is not None:
        return pattern.lower(ctx, node)
    op = export.op_for_target(node.target)
    if op is None:
        raise UnsupportedError(
            f"node {node.name}: expected a registered op, got {export.target_name(node.target)}"
        )
    op.lower(ctx, node)

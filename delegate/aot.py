"""The export flow in one call: torch.export -> edge -> our partitioner -> .pte bytes.

Both ExecuTorch lowering flows are offered: `to_edge_transform_and_lower` (ops our registry
keeps, such as linear and SDPA, are not decomposed) and `to_edge(...).to_backend(...)`.
"""
from __future__ import annotations

import torch
from executorch.exir import EdgeCompileConfig, to_edge, to_edge_transform_and_lower

from delegate.errors import DelegateError
from delegate.partitioner import WgpuPartitioner

FLOWS = ("transform_and_lower", "to_backend")


def lower(model: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None,
          device: str = "webgpu", flow: str = "transform_and_lower", passes=None):
    """Return the ExecutorchProgramManager; `.buffer` is the .pte. `passes`: the partitioner's
    graph passes (delegate/passes: names joined by commas, "none"; None: all)."""
    if flow not in FLOWS:
        raise DelegateError(f"flow: expected one of {FLOWS}, got {flow!r}")
    ep = torch.export.export(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
    partitioner = WgpuPartitioner(device=device, passes=passes)
    config = EdgeCompileConfig(_check_ir_validity=False)
    if flow == "transform_and_lower":
        edge = to_edge_transform_and_lower(ep, partitioner=[partitioner], compile_config=config)
    else:
        edge = to_edge(ep, compile_config=config).to_backend(partitioner)
    return edge.to_executorch()


def undelegated_ops(program_manager) -> list:
    """Targets of the calls left outside every delegate (the runner runs them through ATen)."""
    gm = program_manager.exported_program().graph_module
    skip = ("executorch_call_delegate", "getitem")
    return [str(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and not any(s in str(n.target) for s in skip)]

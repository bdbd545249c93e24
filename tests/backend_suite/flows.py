"""ExecuTorch's backend test suite flows for etwgpu.

Each flow lowers with the suite's own stages except where ours differ: lowering uses
`WgpuPartitioner`, and the Serialize stage runs the `.pte` through our pure-Python runner
instead of ExecuTorch's C++ portable runtime (which cannot call a Python backend).

`etwgpu_portable` lowers nothing and still runs the `.pte` through our runner: the suite only
executes a `.pte` when something was delegated, so this flow is what exercises the runner's
ATen path on every test.
"""
from __future__ import annotations

import copy
from functools import partial

import torch
from executorch.backends.test.harness import Tester
from executorch.backends.test.harness.stages import (
    Partition,
    Serialize,
    StageType,
    ToEdgeTransformAndLower,
)
from executorch.backends.test.suite.flow import TestFlow
from torch.utils._pytree import is_structseq_instance, tree_flatten

from delegate.partitioner import WgpuPartitioner
from delegate.runtime import Runtime


class RunnerSerialize(Serialize):
    """Serialize whose artifact runs on our runner (`device` picks the delegate's executor)."""

    def __init__(self, device: str = "cpu"):
        super().__init__()
        self.device = device

    def run_artifact(self, inputs):
        flat, _ = tree_flatten(inputs)
        with Runtime.get().load_program(self.buffer, device=self.device) as program:
            # Copy before destroy(): outputs may view memory the loaded method owns.
            return copy.deepcopy(tuple(program.load_method("forward").execute(list(flat))))


class _TupleOutput(torch.nn.Module):
    """A model whose output is a torch.return_types struct (`torch.median(x, dim)`'s), with a
    plain tuple of the same tensors out instead. ExecuTorch's emitter serializes the output's
    pytree spec, and torch registers no serialization name for its return types, so such a
    program cannot be emitted on any flow (XNNPACK's included); the suite's portable-kernel
    skip only hides that where nothing claims the op."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return tuple(self.inner(*args))


class EtwgpuTester(Tester):
    """The suite's Tester with our partitioner (when `device` is given) and our runner."""

    def __init__(self, module, example_inputs, dynamic_shapes=None, *, device: str | None):
        with torch.no_grad():   # on copies: a forward may update buffers or its inputs
            if is_structseq_instance(copy.deepcopy(module)(*copy.deepcopy(example_inputs))):
                module = _TupleOutput(module)
        run_device = device or "cpu"
        stage_classes = Tester.default_stage_classes() | {
            StageType.SERIALIZE: partial(RunnerSerialize, run_device),
        }
        if device is not None:
            partitioner = partial(WgpuPartitioner, device=device)
            stage_classes |= {
                # The stage ignores `partitioners=` unless a default class is also given.
                StageType.TO_EDGE_TRANSFORM_AND_LOWER: partial(
                    ToEdgeTransformAndLower, default_partitioner_cls=partitioner),
                StageType.PARTITION: lambda: Partition(partitioner()),
            }
        super().__init__(module, example_inputs, stage_classes=stage_classes,
                         dynamic_shapes=dynamic_shapes)


def _flow(name: str, device: str | None, **kwargs) -> TestFlow:
    return TestFlow(name, backend="etwgpu", tester_factory=partial(EtwgpuTester, device=device),
                    is_delegated=device is not None, **kwargs)


ETWGPU_CPU_FLOW = _flow("etwgpu_cpu", "cpu")
ETWGPU_WEBGPU_FLOW = _flow("etwgpu_webgpu", "webgpu")
ETWGPU_PORTABLE_FLOW = _flow("etwgpu_portable", None)

FLOWS = {f.name: f for f in (ETWGPU_CPU_FLOW, ETWGPU_WEBGPU_FLOW, ETWGPU_PORTABLE_FLOW)}

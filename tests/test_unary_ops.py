"""The unary ops end to end: a model using each of them lowers to one delegate call with no op
left outside, on either device, and its .pte matches eager through our runner."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from delegate.aot import lower, undelegated_ops
from delegate.models import seeded
from tests.test_models import run_pte
from tests.tolerances import tol


class UnaryZoo(nn.Module):
    """clamp (both bounds, one bound, hardtanh, relu6), hardswish, hardsigmoid, abs, sqrt, log,
    log1p, ceil, floor, leaky_relu, elu, sin and cos, after a linear so they see computed
    values."""

    def __init__(self, dim: int = 13):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        h = self.proj(x)
        gates = F.hardswish(h) + F.hardsigmoid(h)
        clamps = h.clamp(-0.5, 0.5) + F.hardtanh(h) + F.relu6(h * 4) + h.clamp(min=0.1)
        roots = torch.sqrt(h.abs() + 1) + torch.log(h.abs() + 1) + torch.log1p(h.abs())
        steps = torch.ceil(x * 3) - torch.floor(x * 3)   # on the input: exact on both sides
        negatives = F.leaky_relu(h, 0.1) + F.elu(h, alpha=0.7)
        angles = torch.sin(h * 5) * torch.cos(h * 5)
        return gates + clamps + roots + steps + negatives + angles


def delegate_calls(pm) -> int:
    gm = pm.exported_program().graph_module
    return sum("executorch_call_delegate" in str(n.target) for n in gm.graph.nodes)


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
@pytest.mark.parametrize("flow", ["transform_and_lower", "to_backend"])
def test_unary_model_is_one_delegate_call_matching_eager(flow, device):
    """transform_and_lower keeps hardswish and hardsigmoid whole; to_backend claims the add,
    clamp, mul and div that edge decomposes them into."""
    model = seeded(UnaryZoo())
    x = torch.randn(5, 13)
    pm = lower(model, (x,), device=device, flow=flow)
    assert undelegated_ops(pm) == []
    assert delegate_calls(pm) == 1
    (got,), = run_pte(pm, [(x,)], device)
    torch.testing.assert_close(got, model(x).detach(), **tol("model", device))

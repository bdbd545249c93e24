"""Whole models: export -> our partitioner (both lowering flows) -> .pte -> our runner, against
eager PyTorch."""
import pytest
import torch
from torch import nn

from delegate.aot import lower, undelegated_ops
from delegate.errors import InputError
from delegate.models import MLP, TinyTransformer, TransformerBlock, seeded
from delegate.runtime.program import Runtime
from tests.tolerances import tol

DEVICES = ["cpu", "webgpu"]


def run_pte(pm, inputs_list, device):
    """Execute the .pte once per inputs tuple; returns the list of output lists."""
    prog = Runtime.get().load_program(pm.buffer, device=device)
    try:
        method = prog.load_method("forward")
        return [method.execute(list(inputs)) for inputs in inputs_list]
    finally:
        prog.destroy()


def assert_matches_eager(pm, xs, model, device):
    """The .pte's one output equals model(x) for each x, within the model tolerance."""
    for x, (got,) in zip(xs, run_pte(pm, [(x,) for x in xs], device)):
        with torch.no_grad():
            want = model(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, **tol("model", device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flow", ["transform_and_lower", "to_backend"])
def test_mlp_is_fully_delegated_and_matches_eager(flow, device):
    model = seeded(MLP(13, 29, 7))
    x = torch.randn(5, 13)
    pm = lower(model, (x,), device=device, flow=flow)
    assert undelegated_ops(pm) == []
    (got,), = run_pte(pm, [(x,)], device)
    torch.testing.assert_close(got, model(x).detach(), **tol("model", device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flow", ["transform_and_lower", "to_backend"])
def test_transformer_block_with_dynamic_sequence_runs_at_three_lengths(flow, device):
    model = seeded(TransformerBlock(dim=64, heads=4, hidden=176))
    seq = torch.export.Dim("seq", min=2, max=64)
    pm = lower(model, (torch.randn(1, 16, 64),), dynamic_shapes=({1: seq},), device=device,
               flow=flow)
    if flow == "transform_and_lower":
        assert undelegated_ops(pm) == []
    assert_matches_eager(pm, [torch.randn(1, t, 64) for t in (3, 17, 64)], model, device)


@pytest.mark.parametrize("device", DEVICES)
def test_tiny_transformer_from_token_ids(device):
    model = seeded(TinyTransformer(vocab=61, dim=32, heads=2, layers=2, hidden=48))
    seq = torch.export.Dim("seq", min=2, max=32)
    pm = lower(model, (torch.randint(0, 61, (1, 8)),), dynamic_shapes=({1: seq},), device=device)
    assert undelegated_ops(pm) == []
    xs = [torch.randint(0, 61, (1, t)) for t in (5, 32)]
    for x, (got,) in zip(xs, run_pte(pm, [(x,) for x in xs], device)):
        with torch.no_grad():
            torch.testing.assert_close(got, model(x), **tol("model", device))


class Accumulator(nn.Module):
    """A mutable buffer updated in place every call, feeding a delegated linear."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3, 5))
        self.proj = nn.Linear(5, 7)

    def forward(self, x):
        self.total.add_(x)
        return self.proj(self.total) * 2.0


@pytest.mark.parametrize("device", DEVICES)
def test_mutable_buffer_state_persists_across_executes(device):
    model = seeded(Accumulator())
    eager = seeded(Accumulator())
    pm = lower(model, (torch.randn(3, 5),), device=device)
    xs = [torch.randn(3, 5) for _ in range(3)]
    outs = run_pte(pm, [(x,) for x in xs], device)
    for x, (got,) in zip(xs, outs):
        with torch.no_grad():
            torch.testing.assert_close(got, eager(x), **tol("model", device))


class MixedDtypes(nn.Module):
    """Integer remainder is outside our op set and must stay with ATen."""

    def forward(self, x, n):
        return torch.relu(x) * 3.0, n % 3


def test_unsupported_nodes_stay_outside_and_still_run():
    model = MixedDtypes()
    x, n = torch.randn(4, 6), torch.arange(5)
    pm = lower(model, (x, n), device="cpu")
    assert any("remainder" in t for t in undelegated_ops(pm))
    (a, b), = run_pte(pm, [(x, n)], "cpu")
    torch.testing.assert_close(a, torch.relu(x) * 3.0)
    torch.testing.assert_close(b, n % 3)


def test_wrong_input_shape_to_a_delegate_raises_input_error():
    model = seeded(MLP(13, 29, 7))
    pm = lower(model, (torch.randn(5, 13),), device="cpu")
    with pytest.raises(InputError, match="expected"):
        run_pte(pm, [(torch.randn(5, 12),)], "cpu")


def test_dynamic_size_above_its_bound_raises_input_error():
    model = seeded(TransformerBlock(dim=32, heads=2, hidden=48))
    seq = torch.export.Dim("seq", min=2, max=16)
    pm = lower(model, (torch.randn(1, 8, 32),), dynamic_shapes=({1: seq},), device="cpu")
    with pytest.raises(InputError, match="expected"):
        run_pte(pm, [(torch.randn(1, 17, 32),)], "cpu")

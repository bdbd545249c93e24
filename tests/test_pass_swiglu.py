"""The swiglu pass (delegate/passes/swiglu.py) and its op silu_mul (delegate/ops/silu_mul.py):
silu(g) * up and sigmoid(g) * g * up become one silu_mul, within 1e-6 of the unfused lowering
on both executors; anything else lowers byte-identically to the passes-off lowering.

References: the kernel against float64 silu(g) * up; a fused program against the same model
lowered with passes="none" (UNFUSED) and against eager float32 (the model tolerance).
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from delegate import blob
from delegate.aot import undelegated_ops
from delegate.errors import DelegateError
from delegate.ir import TensorValue
from delegate.models import seeded
from delegate.ops import get_op
from delegate.passes import swiglu
from delegate.partitioner import WgpuPartitioner
from delegate.runtime import planner
from delegate.runtime.memory import nbytes_of
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from tests.test_batch_norm import _blobs, _ops
from tests.test_kernels_cpu import run1, threads  # noqa: F401  (threads: a fixture)
from tests.test_kernels_wgsl import run_wgsl
from tests.test_models import run_pte
from tests.tolerances import tol

DEVICES = ["cpu", "webgpu"]
UNFUSED = {"rtol": 1e-6, "atol": 1e-6}   # issue 10: the fused program within 1e-6 of unfused
D, H = 13, 29


def _lower(model, inputs, device, passes=None, dynamic_shapes=None):
    ep = torch.export.export(model, tuple(inputs), dynamic_shapes=dynamic_shapes)
    edge = to_edge_transform_and_lower(ep, partitioner=[WgpuPartitioner(device, passes=passes)],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return edge.to_executorch()


def _run(pm, inputs, device):
    (out,), = run_pte(pm, [inputs], device)
    return out


# ---- the kernel --------------------------------------------------------------------------------
def _gate_up(shape):
    torch.manual_seed(0)
    g = torch.randn(shape, dtype=torch.float64) * 4   # into both tails of the sigmoid
    g.view(-1)[:3] = torch.tensor([-90.0, 0.0, 90.0], dtype=torch.float64)
    return g, torch.randn(shape, dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(7, 13), (1, 29), (3, 5, 11), (1, 8192)],
                         ids=["7x13", "1x29", "3x5x11", "llama-decode"])
def test_silu_mul_kernel_matches_float64(device, shape):
    g, up = _gate_up(shape)
    want = F.silu(g) * up
    if device == "cpu":
        got = run1("silu_mul", [g.float(), up.float()])
    else:
        got = run_wgsl("silu_mul", [g, up], {})[0]
    assert tuple(got.shape) == shape
    torch.testing.assert_close(got.double(), want, **tol("transcendental", device))


def test_silu_mul_cpu_kernel_splits_a_large_output_over_the_pool(threads):
    g, up = _gate_up((3, 97, 1024))   # past the pool's parallel threshold
    got = run1("silu_mul", [g.float(), up.float()])
    torch.testing.assert_close(got.double(), F.silu(g) * up, **tol("transcendental"))


def test_silu_mul_infer_rejects_unequal_shapes():
    assert get_op("silu_mul").infer([(7, 13), (7, 13)], {}) == [(7, 13)]
    with pytest.raises(DelegateError, match="expected the gate's shape"):
        get_op("silu_mul").infer([(7, 13), (13,)], {})


# ---- where the pass fires ----------------------------------------------------------------------
PATTERNS = {
    "silu*up": lambda g, u: F.silu(g) * u,
    "up*silu": lambda g, u: u * F.silu(g),
    "sigmoid*g*up": lambda g, u: torch.sigmoid(g) * g * u,
    "up*(g*sigmoid)": lambda g, u: u * (g * torch.sigmoid(g)),
}


class GatedMlp(nn.Module):
    """w2(fn(w1 x, w3 x)): a SwiGLU MLP whose gate product is `fn`."""

    def __init__(self, fn, d=D, h=H):
        super().__init__()
        self.fn = fn
        self.w1, self.w3 = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False)
        self.w2 = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return self.w2(self.fn(self.w1(x), self.w3(x)))


def _mlp(fn):
    torch.manual_seed(0)
    return seeded(GatedMlp(fn)).eval()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_pass_fuses_the_pattern_into_one_silu_mul_within_1e6_of_unfused(device, pattern):
    model, x = _mlp(PATTERNS[pattern]), torch.randn(5, D)
    fused, unfused = _lower(model, [x], device), _lower(model, [x], device, passes="none")
    assert undelegated_ops(fused) == []
    assert _ops(fused) == ["linear", "linear", "silu_mul", "linear"]
    assert "silu_mul" not in _ops(unfused)
    got = _run(fused, [x], device)
    torch.testing.assert_close(got, _run(unfused, [x], device), **UNFUSED)
    torch.testing.assert_close(got, model(x).detach(), **tol("model", device))


@pytest.mark.parametrize("device", DEVICES)
def test_pass_fires_on_executorch_llama_feed_forward_at_any_length(device):
    from executorch.examples.models.llama.feed_forward import FeedForward

    torch.manual_seed(0)
    model = FeedForward(dim=16, hidden_dim=43).eval()
    T = torch.export.Dim("T", min=1, max=16)
    pm = _lower(model, [torch.randn(1, 4, 16)], device, dynamic_shapes=({1: T},))
    assert undelegated_ops(pm) == []
    assert _ops(pm) == ["linear", "linear", "silu_mul", "linear"]
    for t in (1, 7):
        x = torch.randn(1, t, 16)
        torch.testing.assert_close(_run(pm, [x], device), model(x).detach(),
                                   **tol("model", device))


# ---- where it does not, and then changes nothing -----------------------------------------------
class TwoInputs(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, g, u):
        return self.fn(g, u)


def _silu_twice(g, u):
    s = F.silu(g)
    return s * u + s


def _sigmoid_twice(g, u):
    s = torch.sigmoid(g)
    return s * g * u + s


def _silu_product_twice(g, u):
    a = g * torch.sigmoid(g)
    return a * u - a


SECOND_CONSUMER = {"silu": _silu_twice, "sigmoid": _sigmoid_twice,
                   "sigmoid*g": _silu_product_twice}
IS_OUTPUT = {
    "silu": lambda g, u: ((s := F.silu(g)) * u, s),
    "sigmoid": lambda g, u: ((s := torch.sigmoid(g)) * g * u, s),
    "sigmoid*g": lambda g, u: ((a := g * torch.sigmoid(g)) * u, a),
}
NO_MATCH = {
    "glu": lambda g, u: torch.sigmoid(g) * u,             # no g factor: GLU, not SwiGLU
    "silu+up": lambda g, u: F.silu(g) + u,
    "sigmoid*other*up": lambda g, u: torch.sigmoid(g) * u * u,
    "broadcast-up": lambda g, u: F.silu(g) * u[0],        # up [H] broadcast over g [5, H]
    "broadcast-gate": lambda g, u: F.silu(g[0]) * u,
}


def _assert_unchanged(fn, device, inputs=None):
    """Passes on and off give the same blobs, which hold no silu_mul and run like eager."""
    model = TwoInputs(fn)
    inputs = inputs or [torch.randn(5, H), torch.randn(5, H)]
    on, off = _lower(model, inputs, device), _lower(model, inputs, device, passes="none")
    assert _blobs(on) == _blobs(off)
    assert "silu_mul" not in _ops(on)
    return on, model, inputs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("intermediate", sorted(SECOND_CONSUMER))
def test_pass_refuses_an_intermediate_with_a_second_consumer(device, intermediate):
    _assert_unchanged(SECOND_CONSUMER[intermediate], device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("intermediate", sorted(IS_OUTPUT))
def test_pass_refuses_an_intermediate_that_is_an_output(device, intermediate):
    _assert_unchanged(IS_OUTPUT[intermediate], device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("graph", sorted(NO_MATCH))
def test_graph_with_no_match_lowers_byte_identically_and_runs(device, graph):
    pm, model, inputs = _assert_unchanged(NO_MATCH[graph], device)
    assert undelegated_ops(pm) == []
    torch.testing.assert_close(_run(pm, inputs, device), model(*inputs),
                               **tol("model", device))


def test_pass_refuses_float64_operands():
    # the partitioner claims no float64 node, so the pass's own dtype test is asked directly
    fn = TwoInputs(PATTERNS["silu*up"])
    for dtype, fires in ((torch.float32, True), (torch.float64, False)):
        g, u = torch.randn(5, H, dtype=dtype), torch.randn(5, H, dtype=dtype)
        graph = torch.export.export(fn, (g, u)).graph
        assert bool(swiglu.detect(graph)) == fires, dtype


# ---- the compile spec --------------------------------------------------------------------------
@pytest.mark.parametrize("passes", ["none", "fold_batch_norm,fuse_linear"])
def test_compile_spec_without_swiglu_keeps_silu_and_mul(passes):
    model, x = _mlp(PATTERNS["silu*up"]), torch.randn(5, D)
    off, unfused = _lower(model, [x], "cpu", passes=passes), _lower(model, [x], "cpu", "none")
    assert _ops(off) == ["linear", "linear", "silu", "mul", "linear"]
    assert _blobs(off) == _blobs(unfused)


def test_compile_spec_naming_swiglu_alone_fuses():
    model, x = _mlp(PATTERNS["silu*up"]), torch.randn(5, D)
    assert _ops(_lower(model, [x], "cpu", passes="swiglu")) == [
        "linear", "linear", "silu_mul", "linear"]


# ---- aliasing: the planner plans the fused IR --------------------------------------------------
class GateConsumedFirst(nn.Module):
    """gate, then its silu (gate's last reader, unfused), then up, then the product and w2: an
    unfused plan is free to put up into gate's bytes."""

    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(D, H, bias=False), nn.Linear(D, H, bias=False)
        self.w2 = nn.Linear(H, D, bias=False)

    def forward(self, x):
        s = F.silu(self.w1(x))
        up = self.w3(x)
        return self.w2(s * up)


def _plan(graph) -> tuple:
    """(lives, byte offsets) the executors plan for this graph's activations."""
    lives = planner.shared_lifetimes(graph, planner.in_place_roots(graph))
    sizes = {v: nbytes_of(graph.values[v].max_shape, graph.values[v].dtype) for v in lives}
    return lives, planner.plan_offsets(sizes, lives)[0]


def _ir(pm):
    (b,) = _blobs(pm)
    return blob.decode(b)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_silu_mul_never_reads_a_gate_buffer_the_unfused_plan_gave_to_up(device):
    torch.manual_seed(0)
    model, x = seeded(GateConsumedFirst()).eval(), torch.randn(5, D)
    unfused = _ir(_lower(model, [x], device, passes="none"))
    assert [n.op for n in unfused.nodes] == ["linear", "silu", "linear", "mul", "linear"]
    gate, up = unfused.nodes[1].inputs[0], unfused.nodes[2].outputs[0]
    lives, offsets = _plan(unfused)
    assert not lives[gate].overlaps(lives[up]) and offsets[gate] == offsets[up]

    pm = _lower(model, [x], device)
    fused = _ir(pm)
    assert [n.op for n in fused.nodes] == ["linear", "linear", "silu_mul", "linear"]
    gate, up = fused.nodes[2].inputs
    assert all(isinstance(fused.values[v], TensorValue) for v in (gate, up))
    lives, offsets = _plan(fused)
    assert lives[gate].overlaps(lives[up]) and offsets[gate] != offsets[up]
    torch.testing.assert_close(_run(pm, [x], device), model(x).detach(), **tol("model", device))

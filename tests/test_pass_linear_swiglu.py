"""The linear_swiglu pass (delegate/passes/linear_swiglu.py): an MLP's gate/up q4gsw linears and
their silu(g) * up become one linear_q4gsw_swiglu, whose epilogue writes only the product.

References: the same program lowered without the pass (bit for bit), a float64 dequantize-
then-matmul with silu in float64 (within the "q4gsw" tolerance), and, for ExecuTorch's own
Llama, the program with only this pass toggled.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from delegate import passes
from delegate.ops import get_op
from delegate.errors import DelegateError
from kernels_wgsl import q4gsw as wq
from tests.once import once
from tests.tolerances import tol

pytest.importorskip("torchao")
from tests.test_pass_fuse_linear import _blobs, _ops, _quantized, _run  # noqa: E402
from tests.test_llm_et import _steps, llama_program, run_steps  # noqa: E402
from tests.test_q4gsw import golden  # noqa: E402
from tests.test_q4gsw_wgsl import (GEMV_CONFIGS, VARIANTS, _device_variant,  # noqa: E402
                                   _force_gemv)

DEVICES = ["cpu", "webgpu"]
# rms_norm_linear would take the pair with the norm before it (tests/test_pass_rms_norm_linear.py)
FUSED_SPEC = ",".join(n for n in passes.PASSES if n != "rms_norm_linear")
UNFUSED_SPEC = ",".join(n for n in passes.PASSES if n not in ("linear_swiglu", "rms_norm_linear"))
K, N, GS, M_MAX = 160, 37, 32, 37   # prime N: off the GEMV's 4/8 columns and the tiles
LAYERS = 2                          # tests/test_llm_et.py's ARGS
FORMS = {"silu": lambda g, u: F.silu(g) * u, "up*silu": lambda g, u: u * F.silu(g),
         "sigmoid": lambda g, u: torch.sigmoid(g) * g * u}


class GatedMLP(nn.Module):
    """form(gate(x), up(x)) over q4gsw linears; with `order` "up first" the up is made first."""

    def __init__(self, k, n, form, up_first=False):
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(k, n, bias=False) for _ in range(2))
        self.form, self.up_first = form, up_first

    def forward(self, x):
        a, b = self.proj[0](x), self.proj[1](x)
        return self.form(b, a) if self.up_first else self.form(a, b)


@once   # one model per argument set, however spelled: _float64 reads the lowered one
def _model(k=K, n=N, form="silu", up_first=False):
    return _quantized(GatedMLP(k, n, FORMS[form], up_first), (GS, GS))


def _lower(model, device, passes_=None, k=K, m_max=M_MAX):
    from delegate.partitioner import WgpuPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    m = torch.export.Dim("m", min=1, max=m_max)
    ep = torch.export.export(model, (torch.randn(3, k),), dynamic_shapes=({0: m},))
    edge = to_edge_transform_and_lower(ep, partitioner=[WgpuPartitioner(device, passes=passes_)],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return edge.to_executorch()


@once   # the router picks kernels at load (_device_variant, _force_gemv): one lowering for all
def _lowered(device, passes_=None, form="silu", up_first=False, k=K):
    return _lower(_model(k=k, form=form, up_first=up_first), device, passes_, k=k)


def _x(m, k=K):
    # scaled so that g and up are O(1): their product would square the f16 tiles' error
    return 0.25 * torch.randn(m, k, generator=torch.Generator().manual_seed(m + k))


def _float64(model, x):
    """silu(x @ Wg^T) * (x @ Wu^T) in float64 from the torchao weights."""
    g, u = [golden(x, *_weight(p), GS) for p in model.proj]
    if model.up_first:
        g, u = u, g
    return F.silu(g) * u


def _weight(linear):
    w = linear.weight
    return w.qdata, w.scale.reshape(w.qdata.shape[0], -1)


def _same_bits(fused, plain, x, device) -> list:
    """What the fused program ran; asserts its output is the unfused one's bit for bit."""
    (got,), ran = _run(fused, device, [x])
    (want,), _ = _run(plain, device, [x])
    assert torch.equal(got, want)
    return ran


# ---- fires, bit-identical, one dispatch ---------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("up_first", [False, True], ids=["gate-first", "up-first"])
def test_gate_up_and_swiglu_become_one_op_with_the_unfused_bits(device, form, up_first):
    fused = _lowered(device, None, form, up_first)
    plain = _lowered(device, UNFUSED_SPEC, form, up_first)
    assert _ops(fused) == ["linear_q4gsw_swiglu"]
    assert _ops(plain) == ["linear_q4gsw_multi", "silu_mul"]
    model = _model(form=form, up_first=up_first)
    for m in (1, 3, M_MAX):
        x = _x(m)
        ran = _same_bits(fused, plain, x, device)
        assert len(ran) == 1
        if device == "webgpu":
            assert ran == [f"{wq.GEMV if m == 1 else wq.GEMM128} [linear_q4gsw_swiglu]"]
        (got,), _ = _run(fused, device, [x])
        want = _float64(model, x)
        torch.testing.assert_close(got.double(), want, **tol("q4gsw", "cpu" if device == "cpu"
                                                                else "webgpu"))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_both_device_variants_keep_the_unfused_bits(monkeypatch, variant):
    """f16 tiles with the subgroup GEMV, and all-f32 with the workgroup GEMV."""
    gpu = _device_variant(monkeypatch, *VARIANTS[variant])
    fused, plain = _lowered("webgpu"), _lowered("webgpu", UNFUSED_SPEC)
    for m in (1, 3):
        x = _x(m)
        _same_bits(fused, plain, x, "webgpu")
        (got,), _ = _run(fused, "webgpu", [x])
        torch.testing.assert_close(got.double(), _float64(_model(), x),
                                   **tol("q4gsw", "webgpu" if gpu.has_f16 else "webgpu-f32"))


@pytest.mark.parametrize("subgroups", [True, False], ids=["subgroup", "workgroup"])
@pytest.mark.parametrize("config", GEMV_CONFIGS, ids=lambda c: c.name.replace(" ", "-"))
def test_every_gemv_config_pairs_gate_and_up(monkeypatch, subgroups, config):
    _device_variant(monkeypatch, False, subgroups)   # f32 tiles; GEMVs never use f16
    _force_gemv(monkeypatch, lambda k, n: config)
    k = 2080   # 65 groups of 32: chunks per lane ragged for every layout
    fused, plain = _lowered("webgpu", k=k), _lowered("webgpu", UNFUSED_SPEC, k=k)
    assert _same_bits(fused, plain, _x(1, k), "webgpu") == [f"{wq.GEMV} [linear_q4gsw_swiglu]"]


def test_split_k_keeps_the_unfused_bits(monkeypatch):
    """K_SPLIT shrunk to 64 (K = 160: two chunks and a ragged 32): from TILE128_MIN_M the fused
    op runs the split 128x128 tile and its reduce where the unfused gate/up pair does."""
    monkeypatch.setattr(wq, "K_SPLIT", 64)
    m_max = 2 * wq.TILE128_MIN_M + 1
    fused = _lower(_model(), "webgpu", m_max=m_max)
    plain = _lower(_model(), "webgpu", UNFUSED_SPEC, m_max=m_max)
    split = [f"{e} [linear_q4gsw_swiglu]" for e in (wq.GEMM128, "q4gsw_splitk_reduce")]
    for m in (3, wq.TILE128_MIN_M, m_max):
        x = _x(m)
        ran = _same_bits(fused, plain, x, "webgpu")
        assert ran == (split if m >= wq.TILE128_MIN_M else [f"{wq.GEMM128} [linear_q4gsw_swiglu]"])
        (got,), _ = _run(fused, "webgpu", [x])
        torch.testing.assert_close(got.double(), _float64(_model(), x), **tol("q4gsw", "webgpu"))


# ---- ExecuTorch's Llama --------------------------------------------------------------------------
def _llama_int4_pm(device, passes_=FUSED_SPEC):
    """tests/test_llm_et.py's tiny Llama, int4 g32, tokens [1, T] (T dynamic) and input_pos,
    lowered once a session per (device, passes)."""
    return llama_program(device, quantize=True, passes=passes_)


@pytest.mark.parametrize("device", DEVICES)
def test_tiny_llama_ffn_is_one_dispatch_fewer_per_layer_with_the_unfused_bits(device):
    fused, unfused = _llama_int4_pm(device), _llama_int4_pm(device, UNFUSED_SPEC)
    steps = _steps(7, decode=3)   # a prefill, then decode steps (T = 1) on the same cache
    got, described, _ = run_steps(fused, device, steps)
    base, base_described, _ = run_steps(unfused, device, steps)
    assert "silu_mul" not in described["ops"]
    assert described["ops"].count("linear_q4gsw_swiglu") == LAYERS
    assert base_described["ops"].count("silu_mul") == LAYERS
    if device == "webgpu":
        # built: silu_mul's binary and the 64x64 tile the fused op does not need, per layer
        assert base_described["dispatches"] - described["dispatches"] == 2 * LAYERS
        for tokens in steps[:2]:   # run: one fewer per layer, at the prefill and at decode
            inputs = [tokens, torch.tensor([0])]
            assert len(_run(unfused, device, inputs)[1]) - len(_run(fused, device, inputs)[1]) \
                == LAYERS
    for g, b in zip(got, base):
        assert torch.equal(g, b)


# ---- where it does not fire, and then changes nothing ------------------------------------------
class Unfusable(nn.Module):
    def __init__(self, fn, linears=2):
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(K, N, bias=False) for _ in range(linears))
        self.fn = fn

    def forward(self, x):
        return self.fn([p(x) for p in self.proj])


UNFUSABLE = {
    "no swiglu": lambda ys: ys[0] * ys[1],
    "gate read twice": lambda ys: (F.silu(ys[0]) * ys[1], ys[0]),
    "up read twice": lambda ys: F.silu(ys[0]) * ys[1] + ys[1],
    "a triple's pair": lambda ys: (F.silu(ys[0]) * ys[1], ys[2]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(UNFUSABLE))
def test_graph_with_no_match_lowers_byte_identically(device, name):
    linears = 3 if name == "a triple's pair" else 2
    model = _quantized(Unfusable(UNFUSABLE[name], linears), (GS,) * linears)
    on, off = _lower(model, device), _lower(model, device, UNFUSED_SPEC)
    assert _blobs(on) == _blobs(off)
    assert "linear_q4gsw_swiglu" not in _ops(on)


def test_infer_gives_half_the_interleaved_columns_and_rejects_an_odd_n():
    op = get_op("linear_q4gsw_swiglu")
    attrs = {"group_size": GS, "K": K, "N": 2 * N}
    shapes = [(3, K), (2 * N, K // 8), (K // GS, 76)]
    assert op.infer(shapes, attrs) == [(3, N)]
    with pytest.raises(DelegateError, match="linear_q4gsw_swiglu N"):
        op.infer([(3, K), (N, K // 8), (K // GS, 40)], {**attrs, "N": N})

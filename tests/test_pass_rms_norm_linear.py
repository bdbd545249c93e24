"""The rms_norm_linear pass (delegate/passes/rms_norm_linear.py): an RMSNorm whose output only
the linears of one fused q/k/v group or SwiGLU pair read becomes part of that op. At M == 1 the
WebGPU GEMV computes the norm in its prologue (no rms_norm dispatch); at M > 1 the op runs the
rms_norm kernel into scratch before its GEMM.

References: the same program lowered without the pass (bit for bit: the prologue recomputes the
rms_norm kernel's partials and tree), and a float64 RMSNorm then dequantize-then-matmul (the
"q4gsw" tolerance); for ExecuTorch's own Llama, the program with only this pass toggled.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from delegate import blob, passes
from delegate.errors import DelegateError
from delegate.ops import get_op
from kernels_wgsl import q4gsw as wq
from tests.once import once
from tests.tolerances import tol

pytest.importorskip("torchao")
from tests.test_pass_fuse_linear import _blobs, _ops, _quantized, _run  # noqa: E402
from tests.test_pass_linear_swiglu import _lower  # noqa: E402  (K 160, m up to 37)
from tests.test_llm_et import _steps, llama_program, run_steps  # noqa: E402
from tests.test_q4gsw import golden  # noqa: E402
from tests.test_q4gsw_wgsl import (GEMV_CONFIGS, VARIANTS, _device_variant,  # noqa: E402
                                   _force_gemv)

DEVICES = ["cpu", "webgpu"]
UNFUSED_SPEC = ",".join(n for n in passes.PASSES if n != "rms_norm_linear")
K, GS, M_MAX, EPS = 160, 32, 37, 1e-5
WIDTHS = {"qkv": (29, 11, 13), "swiglu": (37, 37)}   # prime: off the GEMV's columns and tiles
FUSED_OP = {"qkv": "linear_q4gsw_multi", "swiglu": "linear_q4gsw_swiglu"}
UNFUSED_OPS = {"qkv": ["rms_norm", "linear_q4gsw_multi"],
               "swiglu": ["rms_norm", "linear_q4gsw_swiglu"]}
LAYERS = 2                          # tests/test_llm_et.py's ARGS


class NormedLinears(nn.Module):
    """ExecuTorch's Llama RMSNorm (x * rsqrt(mean(x * x) + eps) * w), then q4gsw linears of its
    output: q/k/v ("qkv") or silu(gate) * up ("swiglu"); `also` returns something else of
    the norm's output or takes its output elsewhere."""

    def __init__(self, k, form, also=None, weight=True, aten=False):
        super().__init__()
        self.weight = nn.Parameter(0.5 + torch.rand(k, generator=torch.Generator().manual_seed(k)))
        self.proj = nn.ModuleList(nn.Linear(k, w, bias=False) for w in WIDTHS[form])
        self.form, self.also, self.has_weight, self.aten = form, also, weight, aten

    def norm(self, x):
        if self.aten:   # nn.RMSNorm's aten.rms_norm, which the registry keeps whole
            return F.rms_norm(x, [x.shape[-1]], self.weight if self.has_weight else None, EPS)
        y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS)
        return y * self.weight if self.has_weight else y

    def forward(self, x):
        y = self.norm(x)
        ys = [p(y) for p in self.proj]
        out = (F.silu(ys[0]) * ys[1],) if self.form == "swiglu" else tuple(ys)
        if self.also == "norm returned":
            return out + (y,)
        if self.also == "norm read by a linear of x":
            return out + (self.proj[0](x) + y[..., :WIDTHS[self.form][0]],)
        return out


@once
def _model(form, also=None, weight=True, k=K, aten=False):
    return _quantized(NormedLinears(k, form, also, weight, aten), (GS,) * len(WIDTHS[form]))


@once   # the router picks kernels at load (_device_variant, _force_gemv): one lowering for all
def _lowered(device, form, passes_=None, k=K, aten=False):
    return _lower(_model(form, k=k, aten=aten), device, passes_, k=k)


def _x(m, k=K):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(m + k))


def _float64(model, x) -> list:
    x = x.double()
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * model.weight.detach().double()
    ys = [golden(y, p.weight.qdata, p.weight.scale.reshape(p.weight.qdata.shape[0], -1), GS)
          for p in model.proj]
    return [F.silu(ys[0]) * ys[1]] if model.form == "swiglu" else ys


def _same_bits(fused, plain, x, device) -> list:
    """What the fused program ran; asserts its outputs are the unfused ones bit for bit."""
    got, ran = _run(fused, device, [x])
    want, _ = _run(plain, device, [x])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    return ran


def _norm_node(pm):
    (node,) = blob.decode(_blobs(pm)[0]).nodes
    return node


# ---- fires, bit-identical, no rms_norm dispatch at M == 1 ---------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", list(WIDTHS))
@pytest.mark.parametrize("aten", [False, True], ids=["hand-written", "aten.rms_norm"])
def test_norm_joins_the_fused_linear_with_the_unfused_bits(device, form, aten):
    fused = _lowered(device, form, aten=aten)
    plain = _lowered(device, form, UNFUSED_SPEC, aten=aten)
    assert _ops(fused) == [FUSED_OP[form]] and _ops(plain) == UNFUSED_OPS[form]
    node = _norm_node(fused)
    assert len(node.inputs) == 4 and node.attrs["norm_eps"] == pytest.approx(EPS, rel=1e-7)
    model = _model(form, aten=aten)
    for m in (1, 3, M_MAX):
        x = _x(m)
        ran = _same_bits(fused, plain, x, device)
        if device == "webgpu":
            gemm = wq.GEMM128 if form == "swiglu" else wq.GEMM
            want = [wq.GEMV] if m == 1 else ["rms_norm", gemm]
            assert ran == [f"{e} [{FUSED_OP[form]}]" for e in want]
        got, _ = _run(fused, device, [x])
        for g, w in zip(got, _float64(model, x), strict=True):
            torch.testing.assert_close(g.double(), w, **tol("q4gsw", "cpu" if device == "cpu"
                                                              else "webgpu-f32"))


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("form", list(WIDTHS))
def test_both_device_variants_keep_the_unfused_bits(monkeypatch, variant, form):
    """f16 tiles with the subgroup GEMV, and all-f32 with the workgroup GEMV."""
    _device_variant(monkeypatch, *VARIANTS[variant])
    fused, plain = _lowered("webgpu", form), _lowered("webgpu", form, UNFUSED_SPEC)
    for m in (1, 3):
        _same_bits(fused, plain, _x(m), "webgpu")


@pytest.mark.parametrize("subgroups", [True, False], ids=["subgroup", "workgroup"])
@pytest.mark.parametrize("config", GEMV_CONFIGS, ids=lambda c: c.name.replace(" ", "-"))
def test_every_gemv_config_recomputes_the_norm_bit_for_bit(monkeypatch, subgroups, config):
    """K = 2080: 520 vec4s, so the 128 partials hold 4 or 5 each; lanes 32..256 hold 4, 2 or 1
    partials (or none); with and without x staged in workgroup memory."""
    _device_variant(monkeypatch, False, subgroups)   # f32 tiles; GEMVs never use f16
    _force_gemv(monkeypatch, lambda k, n: config)
    k = 2080
    for form in WIDTHS:
        fused, plain = _lowered("webgpu", form, k=k), _lowered("webgpu", form, UNFUSED_SPEC, k=k)
        assert _same_bits(fused, plain, _x(1, k), "webgpu") == [f"{wq.GEMV} [{FUSED_OP[form]}]"]


def test_split_k_reads_the_normalized_scratch(monkeypatch):
    """K_SPLIT shrunk to 64 (K = 160: two chunks and a ragged 32): from TILE128_MIN_M the
    partials are scratch 1, behind the normalized x in scratch 0."""
    monkeypatch.setattr(wq, "K_SPLIT", 64)
    m_max = 2 * wq.TILE128_MIN_M + 1
    for form in WIDTHS:
        fused = _lower(_model(form), "webgpu", m_max=m_max)
        plain = _lower(_model(form), "webgpu", UNFUSED_SPEC, m_max=m_max)
        for m in (wq.TILE128_MIN_M, m_max):
            ran = _same_bits(fused, plain, _x(m), "webgpu")
            assert ran == [f"{e} [{FUSED_OP[form]}]"
                           for e in ("rms_norm", wq.GEMM128, "q4gsw_splitk_reduce")]


@pytest.mark.parametrize("device", DEVICES)
def test_rows_with_inf_and_nan_match_the_unfused_norm(device):
    fused, plain = _lowered(device, "qkv"), _lowered(device, "qkv", UNFUSED_SPEC)
    for m in (1, 3):
        x = _x(m)
        x[0, 7] = float("inf") if m == 1 else float("nan")
        x[-1, 3] = -float("inf")
        _same_bits(fused, plain, x, device)


# ---- ExecuTorch's Llama --------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_tiny_llama_decode_runs_two_dispatches_fewer_per_layer_with_the_unfused_bits(device):
    fused = llama_program(device, quantize=True)
    unfused = llama_program(device, quantize=True, passes=UNFUSED_SPEC)
    steps = _steps(7, decode=3)   # a prefill, then decode steps (T = 1) on the same cache
    got, described, _ = run_steps(fused, device, steps)
    base, base_described, _ = run_steps(unfused, device, steps)
    # attention and FFN norms join their linears; the final norm feeds the lone LM head
    assert described["ops"].count("rms_norm") == 1
    assert base_described["ops"].count("rms_norm") == 2 * LAYERS + 1
    if device == "webgpu":
        assert described["dispatches"] == base_described["dispatches"]   # rms_norm moved in
        for tokens, fewer in zip(steps[:2], (0, 2 * LAYERS)):   # the prefill, then T = 1
            inputs = [tokens, torch.tensor([0])]
            assert len(_run(unfused, device, inputs)[1]) - len(_run(fused, device, inputs)[1]) \
                == fewer
    for g, b in zip(got, base, strict=True):
        assert torch.equal(g, b)


# ---- where it does not fire, and then changes nothing ------------------------------------------
UNFUSABLE = {"norm returned": {"also": "norm returned"},
             "norm read by a linear of x": {"also": "norm read by a linear of x"},
             "norm without weight": {"weight": False},
             "aten.rms_norm without weight": {"weight": False, "aten": True}}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(UNFUSABLE))
def test_graph_with_no_match_lowers_byte_identically(device, name):
    model = _model("qkv", **UNFUSABLE[name])
    on, off = _lower(model, device), _lower(model, device, UNFUSED_SPEC)
    assert _blobs(on) == _blobs(off)
    assert "rms_norm" in _ops(on)


def test_a_lone_linear_after_a_norm_keeps_its_rms_norm():
    class Lone(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = NormedLinears(K, "qkv")
            self.proj = nn.ModuleList([nn.Linear(K, 17, bias=False)])

        def forward(self, x):
            return self.proj[0](self.norm.norm(x))

    model = _quantized(Lone(), (GS,))
    on, off = _lower(model, "cpu"), _lower(model, "cpu", UNFUSED_SPEC)
    assert _blobs(on) == _blobs(off) and _ops(on) == ["rms_norm", "linear_q4gsw"]


# ---- the op's declaration ------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["linear_q4gsw_multi", "linear_q4gsw_swiglu"])
def test_infer_takes_a_norm_weight_of_k_exactly_with_norm_eps(op):
    attrs = {"group_size": GS, "K": K, "N": 74, "norm_eps": EPS}
    if op == "linear_q4gsw_multi":
        attrs["widths"] = [37, 37]
    shapes = [(3, K), (74, K // 8), (K // GS, 76)]
    want = [(3, 37), (3, 37)] if op == "linear_q4gsw_multi" else [(3, 37)]
    assert get_op(op).infer(shapes + [(K,)], attrs) == want
    with pytest.raises(DelegateError, match="norm weight"):
        get_op(op).infer(shapes + [(K + 1,)], attrs)
    with pytest.raises(DelegateError, match="norm weight"):
        get_op(op).infer(shapes, attrs)
    with pytest.raises(DelegateError, match="without norm_eps"):
        get_op(op).infer(shapes + [(K,)], {**attrs, "norm_eps": None})

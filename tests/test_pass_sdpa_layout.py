"""The sdpa_layout pass (delegate/passes/sdpa_layout.py): ExecuTorch's Llama attention reads q
through its transpose and writes its output through the transpose back (sdpa's q_dims and
out_dims), so neither permute is a node of its own; the outputs are the unfused lowering's
bit for bit on both executors, and anything else lowers byte-identically to the pass-off
lowering.

References: the same model lowered without the pass (UNFUSED_SPEC), eager float32 (the model
tolerance), and for the CPU kernel float64 eager SDPA (the WGSL kernel's layouts are checked in
tests/test_attention_wgsl.py).
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from delegate import blob, passes
from delegate.aot import undelegated_ops
from delegate.errors import DelegateError
from delegate.ops import get_op
from tests.test_attention_wgsl import HEADS_MAJOR, LAYOUTS, through_layouts
from tests.test_batch_norm import _blobs, _ops
from tests.test_kernels_cpu import run1
from tests.test_llm_et import VOCAB, _logits, _steps, run_steps, tiny_llama
from tests.test_models import run_pte
from tests.test_pass_swiglu import _lower
from tests.tolerances import tol

DEVICES = ["cpu", "webgpu"]
LAYERS = 2   # tests/test_llm_et.py's ARGS
UNFUSED_SPEC = ",".join(n for n in passes.PASSES if n != "sdpa_layout")


def _llama_pm(device, passes=None):
    seq = torch.export.Dim("T", min=1, max=16)
    example = [torch.randint(0, VOCAB, (1, 4)), {"input_pos": torch.tensor([0])}]
    return _lower(tiny_llama(), example, device, passes=passes,
                  dynamic_shapes=({1: seq}, {"input_pos": None}))


def _sdpa_layouts(pm) -> list:
    return [(n.attrs["q_dims"], n.attrs["out_dims"])
            for b in _blobs(pm) for n in blob.decode(b).nodes if n.op == "sdpa"]


# ---- where it fires: ExecuTorch's Llama ----------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_tiny_llama_attention_runs_no_permute_and_matches_unfused_bit_for_bit(device):
    fused, unfused = _llama_pm(device), _llama_pm(device, passes=UNFUSED_SPEC)
    assert undelegated_ops(fused) == []
    assert _sdpa_layouts(fused) == [(HEADS_MAJOR, HEADS_MAJOR)] * LAYERS
    assert _sdpa_layouts(unfused) == [([], [])] * LAYERS
    steps = _steps(7, decode=3)   # a prefill, then decode steps (T = 1) on the same cache
    got, described, _ = run_steps(fused, device, steps)
    base, base_described, _ = run_steps(unfused, device, steps)
    assert "permute" not in described["ops"]
    assert base_described["ops"].count("permute") == 2 * LAYERS   # q's and the output's
    if device == "webgpu":   # each permute was one strided_copy dispatch
        assert base_described["dispatches"] - described["dispatches"] == 2 * LAYERS
    eager, pos = tiny_llama(), 0
    for tokens, g, b in zip(steps, got, base):
        assert torch.equal(g, b)
        want = _logits(eager(tokens, {"input_pos": torch.tensor([pos])}))
        torch.testing.assert_close(g, want, **tol("model", device))
        pos += tokens.shape[1]


# ---- where it does not fire ----------------------------------------------------------------------
class Attend(nn.Module):
    """fn(q, k, v) -> outputs, around causal sdpas (_sdpa)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, q, k, v):
        return self.fn(q, k, v)


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _q_permute_read_twice(q, k, v):
    qt = q.transpose(1, 2)
    return _sdpa(qt, k, v), qt


def _q_permute_is_k_too(q, k, v):
    qt = q.transpose(1, 2)
    return (_sdpa(qt, qt, v),)


def _output_read_twice(q, k, v):
    y = _sdpa(q, k, v)
    return y.transpose(1, 2) + 1, y


def _head_dim_moves(q, k, v):
    return (_sdpa(q.transpose(2, 3), k, v).transpose(2, 3),)


B, T, H, D = 1, 7, 3, 5
# name -> (fn, q's shape); k and v are [B, H, T, D]
NO_MATCH = {"q-permute-read-twice": (_q_permute_read_twice, (B, T, H, D)),
            "q-permute-is-k-too": (_q_permute_is_k_too, (B, T, H, D)),
            "output-read-twice": (_output_read_twice, (B, H, T, D)),
            "head-dim-moves": (_head_dim_moves, (B, H, D, T))}


def _inputs(q_shape=(B, T, H, D)):
    torch.manual_seed(0)
    return [torch.randn(q_shape), torch.randn(B, H, T, D), torch.randn(B, H, T, D)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(NO_MATCH))
def test_graph_with_no_match_lowers_byte_identically_and_runs(device, name):
    fn, q_shape = NO_MATCH[name]
    model, inputs = Attend(fn), _inputs(q_shape)
    on, off = _lower(model, inputs, device), _lower(model, inputs, device, passes=UNFUSED_SPEC)
    assert _blobs(on) == _blobs(off)
    assert undelegated_ops(on) == []
    got, = run_pte(on, [inputs], device)
    for g, w in zip(got, model(*inputs)):
        torch.testing.assert_close(g, w, **tol("model", device))


@pytest.mark.parametrize("device", DEVICES)
def test_q_alone_reads_through_its_permute(device):
    """The output leaves the partition as the sdpa wrote it: only q's permute goes."""
    model, inputs = Attend(lambda q, k, v: (_sdpa(q.transpose(1, 2), k, v),)), _inputs()
    on = _lower(model, inputs, device)
    assert _ops(on) == ["sdpa"]
    (got,), = run_pte(on, [inputs], device)
    torch.testing.assert_close(got, model(*inputs)[0], **tol("model", device))


@pytest.mark.parametrize("spec", ["none", UNFUSED_SPEC])
def test_compile_spec_without_sdpa_layout_keeps_the_permutes(spec):
    model = Attend(lambda q, k, v: (_sdpa(q.transpose(1, 2), k, v).transpose(1, 2),))
    inputs = _inputs()
    off = _lower(model, inputs, "cpu", passes=spec)
    assert _ops(off).count("permute") == 2
    assert _ops(_lower(model, inputs, "cpu", passes="sdpa_layout")) == ["sdpa"]


# ---- the op's layouts ----------------------------------------------------------------------------
def test_sdpa_infer_reads_q_and_stores_the_output_through_the_layouts():
    infer = get_op("sdpa").infer
    ins = [(2, 11, 3, 5), (2, 3, 13, 5), (2, 3, 13, 7), None]
    attrs = {"is_causal": False, "enable_gqa": False, "q_dims": HEADS_MAJOR}
    assert infer(ins, attrs) == [(2, 3, 11, 7)]
    assert infer(ins, {**attrs, "out_dims": HEADS_MAJOR}) == [(2, 11, 3, 7)]


@pytest.mark.parametrize("dims", [[0, 1, 3, 2], [0, 2, 1], [0, 0, 1, 3]])
def test_sdpa_infer_rejects_layouts_that_move_the_head_dim_or_are_no_permutation(dims):
    ins = [(2, 3, 11, 5), (2, 3, 13, 5), (2, 3, 13, 5), None]
    for key in ("q_dims", "out_dims"):
        with pytest.raises(DelegateError):
            get_op("sdpa").infer(ins, {"is_causal": False, key: dims})


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("causal", [False, True], ids=["grouped", "causal"])
@pytest.mark.parametrize("l", [1, 7])
def test_cpu_kernel_through_the_layouts_matches_float64_and_its_plain_layout_bit_for_bit(
        layout, causal, l):
    """Without a bias the GQA heads of a kv head form one tile (its output rows staged when
    they are not contiguous); with one (the last l of 13 positions causal), each head is one."""
    q, k, v = (torch.randn(2, 6, l, 11), torch.randn(2, 3, 13, 11), torch.randn(2, 3, 13, 5))
    attrs = {"is_causal": causal, "scale": None, "enable_gqa": True, "causal_offset": 13 - l}
    stored_q, out_of = through_layouts(q, LAYOUTS[layout])
    got = out_of(run1("sdpa", [stored_q, k, v, None], **attrs, **LAYOUTS[layout]))
    keep = torch.ones(l, 13, dtype=torch.bool).tril(13 - l) if causal else None
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=keep,
                                          enable_gqa=True)
    torch.testing.assert_close(got.double(), want, **tol("attention", "cpu"))
    assert torch.equal(got, run1("sdpa", [q, k, v, None], **attrs))

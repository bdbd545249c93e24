"""The sdpa_layout pass (delegate/passes/sdpa_layout.py): ExecuTorch's Llama attention reads q,
k and v through their transposes and writes its output through the transpose back (sdpa's
q_dims, k_dims, v_dims and out_dims), so no permute is a node of its own; the outputs are the
unfused lowering's bit for bit on both executors, and anything else lowers byte-identically
to the pass-off lowering.

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
from delegate.runtime.program import Runtime
from tests.test_attention_wgsl import HEADS_MAJOR, LAYOUTS, READS, through_layouts
from tests.test_batch_norm import _blobs, _ops
from tests.test_kernels_cpu import run1
from tests.test_llm_et import VOCAB, _logits, _steps, llama_program, run_steps, tiny_llama
from tests.test_models import run_pte
from tests.test_pass_swiglu import _lower
from tests.tolerances import tol

DEVICES = ["cpu", "webgpu"]
LAYERS = 2   # tests/test_llm_et.py's ARGS
UNFUSED_SPEC = ",".join(n for n in passes.PASSES if n != "sdpa_layout")


def _llama_pm(device, passes=None):
    """test_llm_et's tiny Llama, lowered once a session per (device, passes)."""
    return llama_program(device, passes=passes)


def _sdpa_layouts(pm) -> list:
    """(q_dims, k_dims, v_dims, out_dims) of each sdpa node."""
    return [tuple(n.attrs[key] for key in (*READS, "out_dims"))
            for b in _blobs(pm) for n in blob.decode(b).nodes if n.op == "sdpa"]


def _run_listed(pm, inputs, device) -> tuple:
    """(outputs of one execute, the delegate's dispatch labels on webgpu, else []): a shape
    op's strided_copy is labelled with its op."""
    prog = Runtime.get().load_program(pm.buffer, device=device)
    try:
        m = prog.load_method("forward")
        out = m.execute(list(inputs))
        (_, executor), = m.delegates
        return out, [d[1] for d in executor.dispatch_list()] if device == "webgpu" else []
    finally:
        prog.destroy()


# ---- where it fires: ExecuTorch's Llama ----------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_tiny_llama_attention_runs_no_permute_and_matches_unfused_bit_for_bit(device):
    fused, unfused = _llama_pm(device), _llama_pm(device, passes=UNFUSED_SPEC)
    assert undelegated_ops(fused) == []
    # k and v are the caches (their permutes feed the cache writes' src_dims): read as they are
    assert _sdpa_layouts(fused) == [(HEADS_MAJOR, [], [], HEADS_MAJOR)] * LAYERS
    assert _sdpa_layouts(unfused) == [([], [], [], [])] * LAYERS
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


@pytest.mark.parametrize("device", DEVICES)
def test_tiny_llama_without_a_cache_reads_k_and_v_through_their_permutes_bit_for_bit(device):
    """Without a KV cache, k and v reach the sdpa through their transposes and the repeat of
    their heads (repeat_interleave, which the sdpa's GQA reads without a copy): all four
    permutes of a layer go, each one strided_copy dispatch on WebGPU."""
    model = tiny_llama(use_kv_cache=False, enable_dynamic_shape=False)
    inputs = [torch.randint(0, VOCAB, (1, 11), generator=torch.Generator().manual_seed(3))]
    fused, unfused = _lower(model, inputs, device), _lower(model, inputs, device,
                                                           passes=UNFUSED_SPEC)
    assert _sdpa_layouts(fused) == [(HEADS_MAJOR,) * 4] * LAYERS
    assert "permute" not in _ops(fused) and _ops(unfused).count("permute") == 4 * LAYERS
    (got,), listed = _run_listed(fused, inputs, device)
    (base,), base_listed = _run_listed(unfused, inputs, device)
    assert torch.equal(got, base)
    torch.testing.assert_close(got, _logits(model(*inputs)), **tol("model", device))
    if device == "webgpu":   # a permute's dispatch is one strided_copy, labelled permute
        assert "permute" not in listed and base_listed.count("permute") == 4 * LAYERS
        assert len(base_listed) - len(listed) == 4 * LAYERS


# ---- k and v on their own ------------------------------------------------------------------------
class Attend(nn.Module):
    """fn(q, k, v) -> outputs, around causal sdpas (_sdpa)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, q, k, v):
        return self.fn(q, k, v)


class AttendKv(nn.Module):
    """sdpa(q, k.transpose(1, 2), v.transpose(1, 2)) over k, v stored [B, S, Hkv, D], with
    GQA, and causal or an attn_mask (given as a 4th input)."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2),
                                              *mask, is_causal=self.causal, enable_gqa=True)


# name -> (L, S, D, mask kind), named for the WGSL entry that runs (as tests/
# test_attention_wgsl.py's KV_CASES): decode at L <= DECODE_L, split over 257 keys, the
# register-blocked prefill, the one-row-per-thread flash at D = 256
KV_MODEL_CASES = {"decode-d5-causal": (7, 13, 5, "causal"),
                  "decode-d12-float": (7, 13, 12, "float"),
                  "split-d12-bool": (1, 257, 12, "bool"),
                  "prefill-d5-causal": (11, 13, 5, "causal"),
                  "prefill-d12-float": (11, 13, 12, "float"),
                  "flash-d256-bool": (11, 13, 256, "bool")}
HQ, HKV = 6, 2


def _kv_inputs(l, s, d, kind) -> list:
    torch.manual_seed(l * s + d)
    inputs = [torch.randn(1, HQ, l, d), torch.randn(1, s, HKV, d), torch.randn(1, s, HKV, d)]
    if kind == "bool":
        mask = torch.rand(l, s) > 0.4
        inputs.append(mask.index_fill_(1, torch.tensor([0]), True))
    elif kind == "float":
        inputs.append(torch.randn(1, HQ, l, s))
    return inputs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(KV_MODEL_CASES))
def test_k_and_v_read_through_their_permutes_match_unfused_bit_for_bit(device, case):
    """GQA, prime lengths, causal or a mask; on WebGPU the two permutes were two strided_copy
    dispatches."""
    l, s, d, kind = KV_MODEL_CASES[case]
    model, inputs = AttendKv(kind == "causal"), _kv_inputs(l, s, d, kind)
    fused, unfused = _lower(model, inputs, device), _lower(model, inputs, device,
                                                           passes=UNFUSED_SPEC)
    assert _ops(fused) == ["sdpa"] and _ops(unfused) == ["permute", "permute", "sdpa"]
    assert _sdpa_layouts(fused) == [([], HEADS_MAJOR, HEADS_MAJOR, [])]
    (got,), listed = _run_listed(fused, inputs, device)
    (base,), base_listed = _run_listed(unfused, inputs, device)
    assert torch.equal(got, base)
    torch.testing.assert_close(got, model(*inputs), **tol("model", device))
    if device == "webgpu":   # a permute's dispatch is one strided_copy, labelled permute
        assert len(base_listed) - len(listed) == 2
        assert base_listed.count("permute") == 2 and "permute" not in listed


def _kv_repeated(q, k, v):
    """ExecuTorch's Llama without a cache: k and v transposed, then their heads repeated."""
    k, v = (x.transpose(1, 2).repeat_interleave(HQ // HKV, dim=1) for x in (k, v))
    return (F.scaled_dot_product_attention(q, k, v, is_causal=True),)


@pytest.mark.parametrize("device", DEVICES)
def test_k_and_v_read_through_their_permutes_under_a_repeat_of_their_heads(device):
    model, inputs = Attend(_kv_repeated), _kv_inputs(11, 11, 12, "causal")
    fused, unfused = _lower(model, inputs, device), _lower(model, inputs, device,
                                                           passes=UNFUSED_SPEC)
    assert _ops(fused) == ["sdpa"] and _ops(unfused).count("permute") == 2
    (got,), = run_pte(fused, [inputs], device)
    (base,), = run_pte(unfused, [inputs], device)
    assert torch.equal(got, base)
    torch.testing.assert_close(got, model(*inputs)[0], **tol("model", device))


# ---- where it does not fire ----------------------------------------------------------------------
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


def _k_permute_read_twice(q, k, v):
    kt = k.transpose(1, 2)
    return _sdpa(q, kt, v.transpose(1, 2)).transpose(1, 2), kt


def _k_permute_is_v_too(q, k, v):
    kt = k.transpose(1, 2)
    return (_sdpa(q, kt, kt).transpose(1, 2),)


def _k_repeat_read_twice(q, k, v):
    """k's permute feeds its repeat and an output: it stays (v's, read alone, goes)."""
    kt = k.transpose(1, 2)
    k4, v4 = kt.repeat_interleave(2, dim=1), v.transpose(1, 2).repeat_interleave(2, dim=1)
    return _sdpa(q, k4, v4), kt


B, T, H, D = 1, 7, 3, 5
HEADS_MAJOR_SHAPE, SEQ_MAJOR_SHAPE = (B, H, T, D), (B, T, H, D)
# name -> (fn, q's shape, k's and v's shape)
NO_MATCH = {"q-permute-read-twice": (_q_permute_read_twice, SEQ_MAJOR_SHAPE, HEADS_MAJOR_SHAPE),
            "q-permute-is-k-too": (_q_permute_is_k_too, SEQ_MAJOR_SHAPE, HEADS_MAJOR_SHAPE),
            "output-read-twice": (_output_read_twice, HEADS_MAJOR_SHAPE, HEADS_MAJOR_SHAPE),
            "head-dim-moves": (_head_dim_moves, (B, H, D, T), HEADS_MAJOR_SHAPE)}
# the k permute stays, the other permutes go
K_KEPT = {"k-permute-read-twice": (_k_permute_read_twice, HEADS_MAJOR_SHAPE, SEQ_MAJOR_SHAPE),
          "k-permute-is-v-too": (_k_permute_is_v_too, HEADS_MAJOR_SHAPE, SEQ_MAJOR_SHAPE),
          "k-repeat-read-twice": (_k_repeat_read_twice, (B, 2 * H, T, D), SEQ_MAJOR_SHAPE)}


def _inputs(q_shape=SEQ_MAJOR_SHAPE, kv_shape=HEADS_MAJOR_SHAPE):
    torch.manual_seed(0)
    return [torch.randn(q_shape), torch.randn(kv_shape), torch.randn(kv_shape)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(NO_MATCH))
def test_graph_with_no_match_lowers_byte_identically_and_runs(device, name):
    fn, q_shape, kv_shape = NO_MATCH[name]
    model, inputs = Attend(fn), _inputs(q_shape, kv_shape)
    on, off = _lower(model, inputs, device), _lower(model, inputs, device, passes=UNFUSED_SPEC)
    assert _blobs(on) == _blobs(off)
    assert undelegated_ops(on) == []
    got, = run_pte(on, [inputs], device)
    for g, w in zip(got, model(*inputs)):
        torch.testing.assert_close(g, w, **tol("model", device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(K_KEPT))
def test_a_k_permute_read_elsewhere_or_as_v_too_stays_and_the_result_is_unfused(device, name):
    fn, q_shape, kv_shape = K_KEPT[name]
    model, inputs = Attend(fn), _inputs(q_shape, kv_shape)
    on, off = _lower(model, inputs, device), _lower(model, inputs, device, passes=UNFUSED_SPEC)
    assert _ops(on).count("permute") == 1 and _ops(off).count("permute") > 1
    assert [layout[1] for layout in _sdpa_layouts(on)] == [[]]
    got, = run_pte(on, [inputs], device)
    base, = run_pte(off, [inputs], device)
    for g, b, w in zip(got, base, model(*inputs)):
        assert torch.equal(g, b)
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


def test_sdpa_infer_reads_k_and_v_through_the_layouts():
    """k [B, S, Hkv, E] and v [B, S, Hkv, Ev] stored: the kv_len bound is S's, not Hkv's."""
    infer = get_op("sdpa").infer
    ins = [(2, 6, 11, 5), (2, 13, 3, 5), (2, 13, 3, 7), None]
    attrs = {"is_causal": True, "enable_gqa": True, "k_dims": HEADS_MAJOR,
             "v_dims": HEADS_MAJOR, "kv_len": 13}
    assert infer(ins, attrs) == [(2, 6, 11, 7)]
    with pytest.raises(DelegateError):   # as stored, k's dim 1 (13) is no kv head count
        infer(ins, {**attrs, "v_dims": []})
    with pytest.raises(DelegateError):
        infer(ins, {**attrs, "kv_len": 14})


@pytest.mark.parametrize("dims", [[0, 1, 3, 2], [0, 2, 1], [0, 0, 1, 3]])
def test_sdpa_infer_rejects_layouts_that_move_the_head_dim_or_are_no_permutation(dims):
    ins = [(2, 3, 11, 5), (2, 3, 13, 5), (2, 3, 13, 5), None]
    for key in (*READS, "out_dims"):
        with pytest.raises(DelegateError):
            get_op("sdpa").infer(ins, {"is_causal": False, key: dims})


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("causal", [False, True], ids=["grouped", "causal"])
@pytest.mark.parametrize("l", [1, 7])
def test_cpu_kernel_through_the_layouts_matches_float64_and_its_plain_layout_bit_for_bit(
        layout, causal, l):
    """Without a bias the GQA heads of a kv head form one tile (its output rows staged when
    they are not contiguous); with one (the last l of 13 positions causal), each head is one.
    A permuted k or v head is staged too."""
    q, k, v = (torch.randn(2, 6, l, 11), torch.randn(2, 3, 13, 11), torch.randn(2, 3, 13, 5))
    attrs = {"is_causal": causal, "scale": None, "enable_gqa": True, "causal_offset": 13 - l}
    stored, out_of = through_layouts(LAYOUTS[layout], q, k, v)
    got = out_of(run1("sdpa", [*stored, None], **attrs, **LAYOUTS[layout]))
    keep = torch.ones(l, 13, dtype=torch.bool).tril(13 - l) if causal else None
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=keep,
                                          enable_gqa=True)
    torch.testing.assert_close(got.double(), want, **tol("attention", "cpu"))
    assert torch.equal(got, run1("sdpa", [q, k, v, None], **attrs))


@pytest.mark.parametrize("l, s, e, ev, causal", [(1, 67, 1, 1, False), (3, 130, 5, 1, True),
                                                 (7, 257, 128, 128, True), (4, 64, 12, 5, False)])
def test_cpu_kernel_reads_a_permuted_k_and_v_as_their_copies_bit_for_bit(l, s, e, ev, causal):
    """A permuted k or v head is staged before its mm: MKL's mm over the strided view of a
    [S, 1] v rounds differently from over the copy the unfused permute makes."""
    torch.manual_seed(s)
    q, k, v = torch.randn(2, 6, l, e), torch.randn(2, 3, s, e), torch.randn(2, 3, s, ev)
    attrs = {"is_causal": causal, "scale": None, "enable_gqa": True, "causal_offset": s - l}
    stored, _ = through_layouts(LAYOUTS["kv"], q, k, v)
    got = run1("sdpa", [*stored, None], **attrs, **LAYOUTS["kv"])
    assert torch.equal(got, run1("sdpa", [q, k, v, None], **attrs))
    keep = torch.ones(l, s, dtype=torch.bool).tril(s - l) if causal else None
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=keep,
                                          enable_gqa=True)
    torch.testing.assert_close(got.double(), want, **tol("attention", "cpu"))

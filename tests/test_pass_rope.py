"""The rope pass (delegate/passes/rope.py) and its op rope (delegate/ops/rope.py): Meta's
interleaved rotation (executorch's apply_rotary_emb) and HF's q * cos + rotate_half(q) * sin
(executorch's hf_apply_rotary_emb, a copy of transformers', full and partial) become one rope
per tensor rotated, within 1e-6 of the unfused lowering on both executors; anything else
lowers byte-identically to the passes-off lowering. Two rotations by the same tables (a layer's
q and k) become one rope_pair, one dispatch, bit for bit the two ropes; where they may not
pair, they lower byte-identically to the lowering with pairing off.

References: the kernel against a float64 per-channel loop written from the rotation's
definition; fused programs against the same model lowered with passes="none" (UNFUSED) and
against eager float32 (the model tolerance).
"""
import pytest
import torch
from executorch.examples.models.llama.rope import (apply_rotary_emb, hf_apply_rotary_emb,
                                                   rotate_half)
from executorch.exir import EdgeCompileConfig, to_edge
from torch import nn

from delegate import passes
from delegate.aot import undelegated_ops
from delegate.errors import DelegateError
from delegate.ops import get_op
from delegate.passes import rope
from tests.test_batch_norm import _blobs, _ops
from tests.test_kernels_cpu import run, run1, threads  # noqa: F401  (threads: a fixture)
from tests.test_kernels_wgsl import run_wgsl
from tests.test_llm_et import (VOCAB, _logits, _steps, llama_program, lower_llama, run_steps,
                               tiny_llama)
from tests.test_models import run_pte
from tests.test_pass_swiglu import _lower
from tests.tolerances import tol

DEVICES = ["cpu", "webgpu"]
UNFUSED = {"rtol": 1e-6, "atol": 1e-6}
T, H, D = 7, 3, 10


# ---- the kernel --------------------------------------------------------------------------------
def _reference(x, cos, sin, style, rd):
    """float64, channel by channel: out_j = x_j cos_j -/+ x_k sin_j for j's partner k."""
    x, half = x.double(), rd // 2
    per_channel = []
    for t in (cos.double(), sin.double()):
        if t.shape[-1] == half:   # one angle per pair: spread it to both members
            t = t.repeat_interleave(2, -1) if style == "interleaved" else torch.cat([t, t], -1)
        per_channel.append(t.expand(x.shape[:-1] + (rd,)))
    c, s = per_channel
    out = x.clone()
    for j in range(rd):
        if style == "interleaved":
            k, sign = (j + 1, -1.0) if j % 2 == 0 else (j - 1, 1.0)
        else:
            k, sign = (j + half, -1.0) if j < half else (j - half, 1.0)
        out[..., j] = x[..., j] * c[..., j] + sign * x[..., k] * s[..., j]
    return out


LAYOUTS = {   # x's shape, the tables' leading dims (broadcast over the rest)
    "et": ((1, T, H, D), (1, T, 1)),   # [B, T, H, D], tables [1, T, 1, w]
    "hf": ((2, H, T, D), (T,)),        # [B, H, T, D], tables [T, w]
}


def _operands(layout, width):
    torch.manual_seed(0)
    x_shape, lead = LAYOUTS[layout]
    angles = torch.randn(lead + (width,), dtype=torch.float64) * 3
    return torch.randn(x_shape, dtype=torch.float64), angles.cos(), angles.sin()


def _run_kernel(device, op, ins, attrs) -> list:
    if device == "cpu":
        return run(op, [t.float() for t in ins], **attrs)
    return run_wgsl(op, ins, attrs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("per", ["pair", "channel"])
@pytest.mark.parametrize("rotary_dim", [6, D], ids=["partial6", "full"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_rope_kernel_matches_float64(device, style, per, rotary_dim, layout):
    x, cos, sin = _operands(layout, rotary_dim // 2 if per == "pair" else rotary_dim)
    got, = _run_kernel(device, "rope", [x, cos, sin], {"style": style, "rotary_dim": rotary_dim})
    want = _reference(x, cos, sin, style, rotary_dim)
    assert tuple(got.shape) == tuple(x.shape)
    torch.testing.assert_close(got.double(), want, **tol("elementwise", device))
    # channels past rotary_dim are x itself, bit for bit
    assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:].float())


PAIR_LAYOUTS = {   # q's shape, k's (fewer heads: GQA), the tables' leading dims
    "et": ((1, T, 5, D), (1, T, H, D), (1, T, 1)),
    "hf": ((2, 5, T, D), (2, H, T, D), (T,)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("per", ["pair", "channel"])
@pytest.mark.parametrize("rotary_dim", [6, D], ids=["partial6", "full"])
@pytest.mark.parametrize("layout", sorted(PAIR_LAYOUTS))
def test_rope_pair_kernel_is_two_ropes_bit_for_bit(device, style, per, rotary_dim, layout):
    torch.manual_seed(0)
    q_shape, k_shape, lead = PAIR_LAYOUTS[layout]
    angles = torch.randn(lead + (rotary_dim // 2 if per == "pair" else rotary_dim,),
                         dtype=torch.float64) * 3
    q, k, cos, sin = (torch.randn(q_shape, dtype=torch.float64),
                      torch.randn(k_shape, dtype=torch.float64), angles.cos(), angles.sin())
    attrs = {"style": style, "rotary_dim": rotary_dim}
    pair = _run_kernel(device, "rope_pair", [q, k, cos, sin], attrs)
    for x, got in zip((q, k), pair):
        alone, = _run_kernel(device, "rope", [x, cos, sin], attrs)
        assert torch.equal(got, alone)
        torch.testing.assert_close(got.double(), _reference(x, cos, sin, style, rotary_dim),
                                   **tol("elementwise", device))


def test_rope_cpu_kernel_splits_a_large_tensor_over_the_pool(threads):
    torch.manual_seed(0)
    x, angles = torch.randn(1, 97, 11, 256, dtype=torch.float64), torch.randn(97, 1, 64)
    cos, sin = angles.cos().double(), angles.sin().double()
    got = run1("rope", [x.float(), cos.float(), sin.float()], style="half", rotary_dim=128)
    torch.testing.assert_close(got.double(), _reference(x, cos, sin, "half", 128),
                               **tol("elementwise"))


@pytest.mark.parametrize("x, cos, sin, rotary_dim, message", [
    ((7, 3, 10), (7, 1, 5), (7, 1, 3), 10, "rope sin"),
    ((7, 3, 10), (7, 1, 4), (7, 1, 4), 10, "rope cos"),      # neither R/2 nor R wide
    ((7, 3, 10), (5, 1, 5), (5, 1, 5), 10, "rope cos"),      # 5 does not broadcast to 7
    ((7, 3, 10), (7, 1, 5), (7, 1, 5), 7, "rotary_dim"),     # odd
    ((7, 3, 10), (7, 1, 6), (7, 1, 6), 12, "rotary_dim"),    # past D
], ids=["sin-shape", "width", "lead", "odd-rotary", "rotary-past-D"])
def test_rope_infer_rejects_tables_and_rotary_dims_that_do_not_fit(x, cos, sin, rotary_dim,
                                                                  message):
    with pytest.raises(DelegateError, match=message):
        get_op("rope").infer([x, cos, sin], {"style": "half", "rotary_dim": rotary_dim})


def test_rope_infer_keeps_x_shape():
    attrs = {"style": "interleaved", "rotary_dim": 6}
    assert get_op("rope").infer([(1, 7, 3, 10), (1, 7, 1, 3), (1, 7, 1, 3)], attrs) == [
        (1, 7, 3, 10)]


def test_rope_pair_infer_keeps_each_shape_and_checks_each_against_the_tables():
    attrs, tables = {"style": "half", "rotary_dim": 10}, [(1, 7, 1, 10)] * 2
    infer = get_op("rope_pair").infer
    assert infer([(1, 7, 5, 10), (1, 7, 3, 10), *tables], attrs) == [(1, 7, 5, 10), (1, 7, 3, 10)]
    with pytest.raises(DelegateError, match="rope cos"):   # k's 5 positions do not take 7
        infer([(1, 7, 5, 10), (1, 5, 3, 10), *tables], attrs)


# ---- where it fires: ExecuTorch's Llama ----------------------------------------------------------
# form -> (ModelArgs overrides, style, rotary_dim, webgpu dispatches the pass saves per layer)
FORMS = {   # q and k: 2 x n dispatches -> 1 rope_pair
    "interleaved": ({}, "interleaved", 16, 19),                   # n = 10
    "half": ({"use_hf_rope": True}, "half", 16, 17),              # n = 9
    "half-partial": ({"use_hf_rope": True, "partial_rotary_factor": 0.5}, "half", 8, 23),
}
LAYERS = 2   # tests/test_llm_et.py's ARGS
ALL_BUT_ROPE = ",".join(n for n in passes.PASSES if n != "rope")


def _llama_pm(form, device, passes=None):
    """A llama takes seconds to lower: once a session per argument set (test_llm_et's cache,
    which the other pass tests share: "interleaved" is its plain tiny Llama)."""
    return llama_program(device, passes=passes, **FORMS[form][0])


def _llama_unpaired(form, device, monkeypatch):
    """The llama lowered by every pass, with pairing off: two ropes per layer (not cached:
    the cache's program was paired)."""
    with monkeypatch.context() as patch:
        patch.setattr(rope, "_pairable", lambda first, second, place: False)
        return lower_llama(device, **FORMS[form][0])


def _ropes(pm) -> list:
    """(op, attrs) of every rope and rope_pair node of pm's blobs."""
    from delegate import blob

    return [(n.op, {k: n.attrs[k] for k in ("style", "rotary_dim")})
            for b in _blobs(pm) for n in blob.decode(b).nodes
            if n.op in ("rope", "rope_pair", "rope_cache")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", sorted(FORMS))
def test_pass_fuses_tiny_llama_rotations_within_1e6_of_unfused_and_eager(device, form):
    overrides, style, rotary_dim, _ = FORMS[form]
    fused, unfused = _llama_pm(form, device), _llama_pm(form, device, passes="none")
    assert undelegated_ops(fused) == []
    # the pair joins the layer's cache writes (the rope_cache pass, test_pass_rope_cache.py)
    assert _ropes(fused) == [("rope_cache", {"style": style, "rotary_dim": rotary_dim})] * LAYERS
    assert _ropes(unfused) == []
    steps = _steps(7, decode=3)   # a prefill, then decode steps on the same cache
    got, base = run_steps(fused, device, steps)[0], run_steps(unfused, device, steps)[0]
    eager, pos = tiny_llama(**overrides), 0
    for tokens, g, b in zip(steps, got, base):
        torch.testing.assert_close(g, b, **UNFUSED)
        want = _logits(eager(tokens, {"input_pos": torch.tensor([pos])}))
        torch.testing.assert_close(g, want, **tol("model", device))
        pos += tokens.shape[1]


def _dispatches(pm) -> int:
    return run_steps(pm, "webgpu", [torch.randint(0, VOCAB, (1, 5))])[1]["dispatches"]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_pass_cuts_webgpu_dispatches_per_layer(form):
    saved_per_layer = FORMS[form][3]
    with_rope = _dispatches(_llama_pm(form, "webgpu"))
    without = _dispatches(_llama_pm(form, "webgpu", passes=ALL_BUT_ROPE))
    # + 1: with the rope pass, rope_cache folds the layer's cache-write dispatch in as well
    assert without - with_rope == (saved_per_layer + 1) * LAYERS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", sorted(FORMS))
def test_pair_rotates_q_and_k_of_a_layer_in_one_dispatch_bit_for_bit_two_ropes(device, form,
                                                                              monkeypatch):
    style, steps = FORMS[form][1], _steps(7, decode=2)
    paired = run_steps(_llama_pm(form, device), device, steps)
    alone = run_steps(_llama_unpaired(form, device, monkeypatch), device, steps)
    # paired, the layer's q and k rotations join its cache writes too (rope_cache)
    assert [op for op in paired[1]["ops"] if op.startswith("rope")] == ["rope_cache"] * LAYERS
    assert [op for op in alone[1]["ops"] if op.startswith("rope")] == ["rope"] * (2 * LAYERS)
    if device == "webgpu":
        kernels = [[d[1] for d in run[2] if d[0].startswith("rope")] for run in (paired, alone)]
        assert kernels == [[f"rope_cache_{style}"] * LAYERS, [f"rope_{style}"] * (2 * LAYERS)]
        # two ropes and the cache pair's copy against one rope_cache
        assert alone[1]["dispatches"] - paired[1]["dispatches"] == 2 * LAYERS
    for p, a in zip(paired[0], alone[0]):
        assert torch.equal(p, a)


# ---- the rotation alone: where it fires, and where it does not -----------------------------------
class Rotary(nn.Module):
    """fn(q, k, cos, sin) -> outputs, q [1, T, H, D] and k [1, T, 1, D] as Llama's attention
    holds them, the tables as `tables` builds them."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, q, k, cos, sin):
        return self.fn(q, k, cos, sin)


def _inputs(width, lead=(T,), dtype=torch.float32):
    torch.manual_seed(0)
    angles = torch.randn(lead + (width,), dtype=dtype) * 3
    return [torch.randn(1, T, H, D, dtype=dtype), torch.randn(1, T, 1, D, dtype=dtype),
            angles.cos(), angles.sin()]


def _hf(q, k, cos, sin):
    return hf_apply_rotary_emb(q, k, cos, sin, unsqueeze_dim=1)   # tables [T, R] -> [T, 1, R]


FIRES = {   # name -> (fn, table width, style, rotary_dim, the tables' reshape)
    "et-apply_rotary_emb": (apply_rotary_emb, D // 2, "interleaved", D, "view"),
    "hf-apply_rotary_emb": (_hf, D, "half", D, "unsqueeze"),
    "hf-partial": (_hf, 6, "half", 6, "unsqueeze"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(FIRES))
def test_pass_fuses_q_and_k_rotations_into_one_rope_pair(device, name):
    fn, width, style, rotary_dim, reshape = FIRES[name]
    model, inputs = Rotary(fn), _inputs(width)
    pm = _lower(model, inputs, device)
    assert undelegated_ops(pm) == []
    assert _ops(pm) == [reshape, reshape, "rope_pair"]   # cos and sin reshaped once, shared
    assert _ropes(pm) == [("rope_pair", {"style": style, "rotary_dim": rotary_dim})]
    (q, k), = run_pte(pm, [inputs], device)
    want_q, want_k = fn(*[t.double() for t in inputs])
    torch.testing.assert_close(q.double(), want_q, **tol("elementwise", device))
    torch.testing.assert_close(k.double(), want_k, **tol("elementwise", device))


def _et_pairs(x, cos):
    xr, xi = x.reshape(x.shape[:-1] + (-1, 2)).unbind(-1)
    return xr, xi, cos.view(1, T, 1, -1)


def _et_with(real, imag, extra=None):
    """An interleaved rotation of q alone whose real and imaginary parts are real(xr, xi, c, s)
    and imag(...); extra(xr, xi) adds outputs."""
    def fn(q, k, cos, sin):
        xr, xi, c = _et_pairs(q, cos)
        s = sin.view(c.shape)
        out = torch.stack([real(xr, xi, c, s), imag(xr, xi, c, s)], dim=-1).flatten(3)
        return (out,) + (extra(xr, xi) if extra else ())

    return fn


def _real(xr, xi, c, s):
    return xr * c - xi * s


def _imag(xr, xi, c, s):
    return xr * s + xi * c


def _real_part_is_an_output(q, k, cos, sin):
    xr, xi, c = _et_pairs(q, cos)
    part = xr * c
    real = part - xi * sin.view(c.shape)
    return torch.stack([real, _imag(xr, xi, c, sin.view(c.shape))], dim=-1).flatten(3), part


def _hf_half_is_an_output(q, k, cos, sin):
    lo = q[..., :D // 2]
    rotated = torch.cat((-q[..., D // 2:], lo), dim=-1)
    return q * cos[:, None] + rotated * sin[:, None], lo


def _rotate_half_reversed(x):
    return torch.cat((x[..., :D // 2], -x[..., D // 2:]), dim=-1)


NO_MATCH = {   # name -> (fn, table width)
    "real-part-reversed": (_et_with(lambda xr, xi, c, s: xi * s - xr * c, _imag), D // 2),
    "imag-not-a-rotation": (_et_with(_real, lambda xr, xi, c, s: xr * c + xi * s), D // 2),
    "pair-is-an-output": (_et_with(_real, _imag, lambda xr, xi: (xr,)), D // 2),
    "pair-has-a-second-consumer": (_et_with(_real, _imag, lambda xr, xi: (xr + xi,)), D // 2),
    "product-is-an-output": (_real_part_is_an_output, D // 2),
    "hf-rotate-half-reversed": (
        lambda q, k, c, s: (q * c[:, None] + _rotate_half_reversed(q) * s[:, None],), D),
    "hf-half-is-an-output": (_hf_half_is_an_output, D),
    "tables-widen-x": (   # k [1, T, 1, D] broadcast up to the tables' heads
        lambda q, k, c, s: (k * c + torch.cat((-k[..., D // 2:], k[..., :D // 2]), -1) * s,), D),
}


def _assert_unchanged(fn, width, device, lead=(T,)):
    """Passes on and off give the same blobs, which hold no rope and run like eager."""
    model, inputs = Rotary(fn), _inputs(width, lead)
    on, off = _lower(model, inputs, device), _lower(model, inputs, device, passes="none")
    assert _blobs(on) == _blobs(off)
    assert "rope" not in _ops(on)
    return on, model, inputs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(NO_MATCH))
def test_graph_with_no_match_lowers_byte_identically_and_runs(device, name):
    fn, width = NO_MATCH[name]
    lead = (1, T, H) if name == "tables-widen-x" else (T,)
    pm, model, inputs = _assert_unchanged(fn, width, device, lead)
    assert undelegated_ops(pm) == []
    got, = run_pte(pm, [inputs], device)
    for g, w in zip(got, model(*inputs)):
        torch.testing.assert_close(g, w, **tol("model", device))


def test_pass_refuses_float64_operands():
    # the partitioner claims no float64 node, so the pass's own dtype test is asked directly
    for dtype, fires in ((torch.float32, True), (torch.float64, False)):
        ep = torch.export.export(Rotary(apply_rotary_emb), tuple(_inputs(D // 2, dtype=dtype)))
        edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
        assert bool(rope.detect(edge.exported_program().graph)) == fires, dtype


def _k_by_other_tables(q, k, cos, sin):
    """q by (cos, sin), k by (sin, cos): the angle pi/2 - a, tables q's rotation does not read."""
    return apply_rotary_emb(q, k, cos, sin)[0], apply_rotary_emb(q, k, sin, cos)[1]


def _q_read_before_k_rotates(q, k, cos, sin):
    c, s = cos[:, None], sin[:, None]
    q_out = q * c + rotate_half(q) * s
    scaled = q_out * 2.0   # traced before k's rotation: a pair emitted at k's would come late
    return scaled, k * c + rotate_half(k) * s


def _q_rotated_twice(q, k, cos, sin):
    c, s = cos[:, None], sin[:, None]
    once = q * c + rotate_half(q) * s
    return (once * c + rotate_half(once) * s,)


NO_PAIR = {   # name -> (fn, table width): two ropes that must stay two
    "k-by-other-tables": (_k_by_other_tables, D // 2),
    "q-read-before-k-rotates": (_q_read_before_k_rotates, D),
    "q-rotated-twice": (_q_rotated_twice, D),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(NO_PAIR))
def test_ropes_that_may_not_pair_lower_as_with_pairing_off_and_run(device, name, monkeypatch):
    fn, width = NO_PAIR[name]
    model, inputs = Rotary(fn), _inputs(width)
    pm = _lower(model, inputs, device)
    with monkeypatch.context() as patch:
        patch.setattr(rope, "_pairable", lambda first, second, place: False)
        assert _blobs(pm) == _blobs(_lower(model, inputs, device))
    assert [op for op, _ in _ropes(pm)] == ["rope", "rope"]
    got, = run_pte(pm, [inputs], device)
    for g, w in zip(got, model(*[t.double() for t in inputs])):
        torch.testing.assert_close(g.double(), w, **tol("elementwise", device))


# ---- the compile spec --------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["none", ALL_BUT_ROPE])
def test_compile_spec_without_rope_keeps_the_unfused_rotation(spec):
    model, inputs = Rotary(apply_rotary_emb), _inputs(D // 2)
    off, unfused = _lower(model, inputs, "cpu", passes=spec), _lower(model, inputs, "cpu", "none")
    assert {"mul", "sub", "add", "cat"} <= set(_ops(off)) and "rope" not in _ops(off)
    assert _blobs(off) == _blobs(unfused)


def test_compile_spec_naming_rope_alone_fuses():
    model, inputs = Rotary(apply_rotary_emb), _inputs(D // 2)
    assert _ops(_lower(model, inputs, "cpu", passes="rope")) == ["view", "view", "rope_pair"]

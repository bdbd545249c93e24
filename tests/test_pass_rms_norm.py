"""The rms_norm pass (delegate/passes/rms_norm.py): a hand-written RMSNorm, as ExecuTorch's
Llama and HF's LlamaRMSNorm write it, becomes one rms_norm. On cpu it is bit-identical to the
unfused lowering; on webgpu within 1e-6 of it (the pass docstring says why not exactly);
anything else lowers byte-identically to the passes-off lowering.

References: a float64 RMSNorm computed here; the same model lowered with passes="none"
(UNFUSED); ExecuTorch's eager Llama (the model tolerance).
"""
import pytest
import torch
from torch import nn

from delegate import blob
from delegate.aot import undelegated_ops
from delegate.passes import PASSES, rms_norm
from delegate.preprocess import lower_to_ir
from delegate.runtime.program import Runtime
from tests.test_batch_norm import _blobs, _ops
from tests.test_llm_et import ARGS, _logits, _steps, llama_program, tiny_llama
from tests.test_pass_swiglu import _lower, _run
from tests.tolerances import tol

DEVICES = ["cpu", "webgpu"]
# webgpu: the sum of squares may take an fma the unfused chain cannot (a few 1e-7 relative)
UNFUSED = {"cpu": {"rtol": 0.0, "atol": 0.0}, "webgpu": {"rtol": 1e-6, "atol": 1e-6}}
CHAIN = ["mul", "mean", "add", "rsqrt", "mul", "mul"]
D, T, EPS = 29, 5, 1e-6


def _want(x, w, eps=EPS):
    x = x.double()
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w.double()


class HandWritten(nn.Module):
    """fn(x, weight, eps): an RMSNorm spelled out, with a random weight of [D]."""

    def __init__(self, fn, d=D):
        super().__init__()
        self.fn = fn
        torch.manual_seed(0)
        self.weight = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return self.fn(x, self.weight, EPS)


def _ms(x):
    return (x * x).mean(-1, keepdim=True)


class HfRmsNorm(nn.Module):
    """transformers' LlamaRMSNorm.forward, verbatim but for the import."""

    def __init__(self, d=D, eps=EPS):
        super().__init__()
        torch.manual_seed(0)
        self.weight = nn.Parameter(torch.randn(d))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def _et_rms_norm(d=D, **kw):
    from executorch.examples.models.llama.norm import RMSNorm

    m = RMSNorm(d, eps=EPS, **kw).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        m.weight.copy_(torch.randn(d))
    return m


def _x(*shape):
    torch.manual_seed(1)
    return torch.randn(*shape) * 3


def _ir_nodes(pm):
    (b,) = _blobs(pm)
    return blob.decode(b).nodes


def _fused_and_unfused(model, x, device):
    on, off = _lower(model, [x], device), _lower(model, [x], device, passes="none")
    assert undelegated_ops(on) == [] and undelegated_ops(off) == []
    return on, off


# ---- where the pass fires ----------------------------------------------------------------------
FORMS = {
    "et": lambda: _et_rms_norm(),
    "hf": lambda: HfRmsNorm(),
    "x*x-reversed": lambda: HandWritten(lambda x, w, e: w * (torch.rsqrt(e + _ms(x)) * x)),
    "pow": lambda: HandWritten(
        lambda x, w, e: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e) * w),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", sorted(FORMS))
def test_pass_fuses_the_chain_into_one_rms_norm_with_the_weight(device, form):
    model, x = FORMS[form](), _x(T, D)
    on, off = _fused_and_unfused(model, x, device)
    (node,) = _ir_nodes(on)
    assert node.op == "rms_norm" and node.inputs[1] != -1
    assert node.attrs["normalized_shape"] == [D]
    assert node.attrs["eps"] == pytest.approx(EPS, rel=1e-7)   # the float32 constant edge lifted
    assert _ops(off) == (["pow"] if form in ("hf", "pow") else ["mul"]) + CHAIN[1:]
    got = _run(on, [x], device)
    torch.testing.assert_close(got, _run(off, [x], device), **UNFUSED[device])
    torch.testing.assert_close(got.double(), _want(x, model.weight.detach()),
                               **tol("normalization", device))


@pytest.mark.parametrize("device", DEVICES)
def test_pass_fuses_a_norm_without_weight_to_rms_norm_with_weight_absent(device):
    model, x = HandWritten(lambda x, w, e: x * torch.rsqrt(_ms(x) + e)), _x(3, 4, D)
    on, off = _fused_and_unfused(model, x, device)
    (node,) = _ir_nodes(on)
    assert (node.op, node.inputs[1]) == ("rms_norm", -1)
    got = _run(on, [x], device)
    torch.testing.assert_close(got, _run(off, [x], device), **UNFUSED[device])
    torch.testing.assert_close(got.double(), _want(x, None), **tol("normalization", device))


@pytest.mark.parametrize("device", DEVICES)
def test_pass_takes_a_computed_weight_of_the_last_dims_size(device):
    model, x = _et_rms_norm(add_unit_offset=True), _x(T, D)   # output * (1 + weight)
    on, off = _fused_and_unfused(model, x, device)
    assert _ops(on) == ["add", "rms_norm"]
    got = _run(on, [x], device)
    torch.testing.assert_close(got, _run(off, [x], device), **UNFUSED[device])
    torch.testing.assert_close(got.double(), _want(x, 1 + model.weight.detach()),
                               **tol("normalization", device))


@pytest.mark.parametrize("device", DEVICES)
def test_a_weight_of_another_shape_stays_a_mul_after_rms_norm(device):
    class ScaledBy(nn.Module):   # a second input [T, D]: no [D] weight to absorb
        def forward(self, x, s):
            return x * torch.rsqrt(_ms(x) + EPS) * s

    x, s = _x(T, D), torch.randn(T, D)
    on = _lower(ScaledBy(), [x, s], device)
    off = _lower(ScaledBy(), [x, s], device, passes="none")
    assert _ops(on) == ["rms_norm", "mul"] and _ir_nodes(on)[0].inputs[1] == -1
    got = _run(on, [x, s], device)
    torch.testing.assert_close(got, _run(off, [x, s], device), **UNFUSED[device])


def test_a_python_float_eps_matches_as_the_lifted_constant_does():
    # edge lifts eps to a 0-d constant; an ATen graph keeps the float in aten.add.Tensor
    model = HandWritten(lambda x, w, e: x * torch.rsqrt(_ms(x) + e) * w)
    ep = torch.export.export(model, (_x(T, D),)).run_decompositions({})
    add = next(n for n in ep.graph.nodes if n.name == "add")
    assert add.args[1] == EPS
    graph = lower_to_ir(ep)
    assert [(n.op, n.attrs) for n in graph.nodes] == [
        ("rms_norm", {"normalized_shape": [D], "eps": EPS})]


# ---- ExecuTorch's Llama --------------------------------------------------------------------------
def _all_passes_but_this_one() -> str:
    """The Llama graph also matches other passes (SwiGLU): the reference keeps them."""
    return ",".join(n for n in PASSES if n != "rms_norm") or "none"


def _llama(device, passes=None):
    """test_llm_et's tiny Llama, lowered once a session per (device, passes)."""
    pm = llama_program(device, passes=passes)
    assert undelegated_ops(pm) == []
    return pm


def _dispatches(handle, device) -> int:
    """WGSL dispatches a step list holds on webgpu, kernel calls on cpu."""
    info = handle.describe()
    return info["dispatches"] if device == "webgpu" else len(info["ops"])


@pytest.mark.parametrize("device", DEVICES)
def test_et_llama_norms_become_rms_norm_five_dispatches_fewer_each(device):
    fused, plain = _llama(device), _llama(device, _all_passes_but_this_one())
    layers = ARGS["n_layers"]
    ops = _ops(fused)
    assert ops.count("rms_norm") == 2 * layers + 1   # attention and FFN norms, the final norm
    assert "mean" not in ops and "rsqrt" not in ops
    assert _ops(plain).count("rsqrt") == 2 * layers + 1 and "rms_norm" not in _ops(plain)
    counts = []
    for pm in (plain, fused):
        prog = Runtime.get().load_program(pm.buffer, device=device)
        try:
            (_, handle), = prog.load_method("forward").delegates
            counts.append(_dispatches(handle, device))
        finally:
            prog.destroy()
    # 6 dispatches per norm become 1: 10 fewer per layer, 5 for the final norm
    assert counts[0] - counts[1] == 5 * (2 * layers + 1), counts


@pytest.mark.parametrize("device", DEVICES)
def test_et_llama_prefill_and_decode_match_unfused_and_eager(device):
    eager = tiny_llama()
    progs = [Runtime.get().load_program(_llama(device, p).buffer, device=device)
             for p in (None, _all_passes_but_this_one())]
    # cpu: bit-identical end to end; webgpu: a few-1e-7 change at each norm, carried through
    # attention and the MLPs, so the model tolerance
    unfused = UNFUSED["cpu"] if device == "cpu" else tol("model", device)
    try:
        fused, plain = (p.load_method("forward") for p in progs)
        pos = 0
        for tokens in _steps(7, decode=3):
            at = torch.tensor([pos])
            got = _logits(fused.execute([tokens, at]))
            torch.testing.assert_close(got, _logits(plain.execute([tokens, at])), **unfused)
            torch.testing.assert_close(got, _logits(eager(tokens, {"input_pos": at})),
                                       **tol("model", device))
            pos += tokens.shape[1]
    finally:
        for p in progs:
            p.destroy()


# ---- where it does not, and then changes nothing -------------------------------------------------
class OneInput(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _second_consumer(which):
    def fn(x):
        s = x * x
        m = s.mean(-1, keepdim=True)
        a = m + EPS
        r = torch.rsqrt(a)
        extra = {"square": s, "mean": m, "add": a, "rsqrt": r}[which]
        return x * r + extra
    return fn


def _is_output(which):
    def fn(x):
        s = x * x
        m = s.mean(-1, keepdim=True)
        a = m + EPS
        r = torch.rsqrt(a)
        return x * r, {"square": s, "mean": m, "add": a, "rsqrt": r}[which]
    return fn


INTERMEDIATES = ["square", "mean", "add", "rsqrt"]
NO_MATCH = {
    "mean-dim0": lambda x: x * torch.rsqrt((x * x).mean(0, keepdim=True) + EPS),
    "mean-dim-2": lambda x: x * torch.rsqrt((x * x).mean(-2, keepdim=True) + EPS),
    "mean-two-dims": lambda x: x * torch.rsqrt((x * x).mean((-2, -1), keepdim=True) + EPS),
    "no-keepdim": lambda x: x * torch.rsqrt((x * x).mean(-1) + EPS),   # [D, D]: broadcasts
    "eps-zero": lambda x: x * torch.rsqrt(_ms(x) + 0.0),
    "no-eps": lambda x: x * torch.rsqrt(_ms(x)),
    "sqrt": lambda x: x * torch.sqrt(_ms(x) + EPS),
    "fourth-power": lambda x: x * torch.rsqrt(x.pow(4).mean(-1, keepdim=True) + EPS),
    "other-x": lambda x: (x + 1) * torch.rsqrt(_ms(x) + EPS),
    "square-of-two": lambda x: x * torch.rsqrt((x * (x + 1)).mean(-1, keepdim=True) + EPS),
    "eps-times-2": lambda x: x * torch.rsqrt(torch.add(_ms(x), EPS, alpha=2)),
}


def _assert_unchanged(fn, device, x=None):
    """Passes on and off give the same blobs, which hold no rms_norm and run like eager."""
    model, x = OneInput(fn), _x(D, D) if x is None else x
    on, off = _lower(model, [x], device), _lower(model, [x], device, passes="none")
    assert _blobs(on) == _blobs(off)
    assert "rms_norm" not in _ops(on)
    return on, model, x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("intermediate", INTERMEDIATES)
def test_pass_refuses_an_intermediate_with_a_second_consumer(device, intermediate):
    _assert_unchanged(_second_consumer(intermediate), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("intermediate", INTERMEDIATES)
def test_pass_refuses_an_intermediate_that_is_an_output(device, intermediate):
    _assert_unchanged(_is_output(intermediate), device)


@pytest.mark.parametrize("device", DEVICES)
def test_a_normalized_product_read_twice_keeps_its_weight_mul(device):
    model = HandWritten(lambda x, w, e: (n := x * torch.rsqrt(_ms(x) + e)) * w + n)
    x = _x(T, D)
    on, off = _fused_and_unfused(model, x, device)
    assert _ops(on) == ["rms_norm", "mul", "add"] and _ir_nodes(on)[0].inputs[1] == -1
    torch.testing.assert_close(_run(on, [x], device), _run(off, [x], device), **UNFUSED[device])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("graph", sorted(NO_MATCH))
def test_graph_with_no_match_lowers_byte_identically_and_runs(device, graph):
    pm, model, x = _assert_unchanged(NO_MATCH[graph], device)
    assert undelegated_ops(pm) == []
    torch.testing.assert_close(_run(pm, [x], device), model(x), **tol("model", device))


def test_pass_refuses_float64():
    # the partitioner claims no float64 node, so the pass's own dtype test is asked directly
    model = HandWritten(lambda x, w, e: x * torch.rsqrt(_ms(x) + e) * w)
    for dtype, fires in ((torch.float32, True), (torch.float64, False)):
        ep = torch.export.export(model.to(dtype), (_x(T, D).to(dtype),)).run_decompositions({})
        assert bool(rms_norm.detect(ep.graph)) == fires, dtype


# ---- the compile spec ----------------------------------------------------------------------------
@pytest.mark.parametrize("passes", ["none", "fold_batch_norm,swiglu"])
def test_compile_spec_without_rms_norm_keeps_the_chain(passes):
    model, x = _et_rms_norm(), _x(T, D)
    off, unfused = _lower(model, [x], "cpu", passes=passes), _lower(model, [x], "cpu", "none")
    assert _ops(off) == CHAIN
    assert _blobs(off) == _blobs(unfused)


def test_compile_spec_naming_rms_norm_alone_fuses():
    model, x = _et_rms_norm(), _x(T, D)
    assert _ops(_lower(model, [x], "cpu", passes="rms_norm")) == ["rms_norm"]

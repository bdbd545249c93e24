"""The residual_add pass (delegate/passes/residual_add.py): linear_q4gsw(x) + r becomes one
linear_q4gsw with a residual input, whose epilogue adds r after the bias. The fused output is
bit-identical (torch.equal) to the unfused linear and add on both executors and on every
WebGPU route (each GEMV layout and reduction, both GEMM tiles, f16 tiles), one dispatch fewer.

References: the same model lowered with the pass off (bits), eager torchao (the q4gsw
tolerance), and for ExecuTorch's own Llama, the program with only this pass toggled.
"""
import functools

import pytest
import torch
from torch import nn

import kernels_wgsl
from kernels_wgsl.device import get_device
from delegate import blob
from delegate.errors import DelegateError
from delegate.ops import get_op
from delegate.passes import PASSES
from kernels_wgsl import q4gsw as wq
from tests.once import once
from tests.tolerances import tol

pytest.importorskip("torchao")
from tests.test_pass_fuse_linear import (_blobs, _llama_lowered, _ops, _quantized,  # noqa: E402
                                         _run, _tiny_llama_int4)
from tests.test_pass_swiglu import _plan  # noqa: E402
from tests.test_q4gsw_wgsl import _device_variant, _force_gemv  # noqa: E402

DEVICES = ["cpu", "webgpu"]
ALL_BUT_THIS = ",".join(n for n in PASSES if n != "residual_add")
K, N, GS, M_MAX = 160, 67, 32, 37     # prime N: off the GEMV's 4/8 columns and the 64 tiles
ORDERS = {"linear+r": lambda y, r: y + r, "r+linear": lambda y, r: r + y}


class LinearPlusResidual(nn.Module):
    """combine(proj(x), r): a q4gsw linear and its residual (the decoder layer's wo, w2)."""

    def __init__(self, k, n, bias, combine=ORDERS["r+linear"]):
        super().__init__()
        self.proj = nn.ModuleList([nn.Linear(k, n, bias=bias)])
        self.combine = combine

    def forward(self, x, r):
        return self.combine(self.proj[0](x), r)


@once   # nn.Linear draws its bias from the global RNG: a second build is another model
def _model(k=K, n=N, bias=True, order="r+linear"):
    return _quantized(LinearPlusResidual(k, n, bias, ORDERS[order]), (GS,))


def _lower(model, device, passes=None, k=K, n=N, m_max=M_MAX, r_shape=None):
    """x [m, K] and r [m, N] (or r_shape, static), m dynamic up to m_max."""
    from delegate.partitioner import WgpuPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    m = torch.export.Dim("m", min=1, max=m_max)
    example = (torch.randn(3, k), torch.randn(r_shape or (3, n)))
    ep = torch.export.export(model, example, dynamic_shapes=({0: m}, None if r_shape else {0: m}))
    edge = to_edge_transform_and_lower(ep, partitioner=[WgpuPartitioner(device, passes=passes)],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return edge.to_executorch()


@once   # the router picks kernels at load (_route, _force_gemv): one lowering serves them all
def _lowered(device, passes=None, bias=True, order="r+linear", k=K):
    return _lower(_model(k=k, bias=bias, order=order), device, passes, k=k)


def _inputs(m, k=K, n=N):
    g = torch.Generator().manual_seed(m + k)
    return [torch.randn(m, k, generator=g), torch.randn(m, n, generator=g)]


def _same_bits(fused, plain, inputs, device) -> tuple:
    """(what the fused program ran, what the unfused one ran); asserts equal outputs."""
    (got,), ran_fused = _run(fused, device, inputs)
    (want,), ran_plain = _run(plain, device, inputs)
    assert torch.equal(got, want)
    return ran_fused, ran_plain


# ---- fires, bit-identical, one dispatch fewer ----------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("order", list(ORDERS))
def test_fused_ir_holds_one_linear_with_the_residual_input(device, bias, order):
    fused, plain = _lowered(device, None, bias, order), _lowered(device, "none", bias, order)
    assert _ops(fused) == ["linear_q4gsw"] and _ops(plain) == ["linear_q4gsw", "add"]
    graph = blob.decode(_blobs(fused)[0])
    (node,) = graph.nodes
    assert len(node.inputs) == 5 and node.inputs[4] == graph.inputs[1]   # r itself
    assert (node.inputs[3] != -1) == bias


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("order", list(ORDERS))
def test_fused_output_is_bit_identical_to_linear_then_add_in_one_dispatch(device, bias, order):
    fused, plain = _lowered(device, None, bias, order), _lowered(device, "none", bias, order)
    for m in (1, 3, 37):
        x, r = _inputs(m)
        ran_fused, ran_plain = _same_bits(fused, plain, [x, r], device)
        assert len(ran_fused) == 1 and len(ran_plain) == 2
        if device == "webgpu":
            kernel = wq.GEMV if m == 1 else wq.GEMM
            assert ran_fused == [f"{kernel} [linear_q4gsw]"]
            assert ran_plain == [f"{kernel} [linear_q4gsw]", "binary [add]"]
        (got,), _ = _run(fused, device, [x, r])
        torch.testing.assert_close(got, _model(bias=bias, order=order)(x, r),
                                   **tol("q4gsw", "cpu" if device == "cpu" else "webgpu"))


@functools.lru_cache(maxsize=None)
def _model_sized(device, passes):
    return _lower(_model(k=2048, n=2048, bias=False), device, passes, k=2048, n=2048, m_max=64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 64], ids=["decode", "prefill"])
def test_model_sized_projection_keeps_the_unfused_bits(device, m):
    """N = K = 2048, group 32: a Llama-3.2-1B wo with its residual; on webgpu M = 64 splits K
    (K_SPLIT) and the reduce's epilogue adds the residual."""
    ran, _ = _same_bits(_model_sized(device, None), _model_sized(device, "none"),
                        _inputs(m, 2048, 2048), device)
    split = device == "webgpu" and m >= wq.TILE128_MIN_M and wq.k_splits(2048) > 1
    assert ran == ([f"{e} [linear_q4gsw]" for e in (wq.GEMM128, "q4gsw_splitk_reduce")]
                   if split else ran[:1])


# ---- every WebGPU route --------------------------------------------------------------------
def _route(monkeypatch, route):
    """Pin the router (kernels_wgsl/q4gsw.py) to one kernel before a program loads."""
    if route == "gemm64":
        monkeypatch.setattr(wq, "TILE128_MIN_M", 10**9)
    elif route == "gemm128":
        monkeypatch.setattr(wq, "TILE128_MIN_M", 2)
        monkeypatch.setattr(wq, "TILE128_MIN_TILES", 1)
    elif route == "gemm64-f16":
        gpu = get_device()
        if not gpu.has_f16:
            pytest.skip(f"adapter {gpu.name}: lacks shader-f16")
        monkeypatch.setattr(wq, "TILES_F16", True)


@pytest.mark.parametrize("route,kernel", [("gemm64", wq.GEMM), ("gemm128", wq.GEMM128),
                                          ("gemm64-f16", wq.GEMM)])
def test_both_gemm_tiles_add_the_residual_after_the_bias(monkeypatch, route, kernel):
    _route(monkeypatch, route)
    fused, plain = _lowered("webgpu"), _lowered("webgpu", "none")
    for m in (3, 37):
        ran, _ = _same_bits(fused, plain, _inputs(m), "webgpu")
        assert ran == [f"{kernel} [linear_q4gsw]"]


# Layouts (words, lanes) with schedules (cols, unroll, x staged), as the GEMV sweep varies them.
GEMV_CONFIGS = [wq.GemvConfig(*c) for c in [(1, 64, 4, 4, False), (2, 32, 4, 4, False),
                                            (2, 128, 8, 1, True), (4, 32, 16, 2, False)]]


@pytest.mark.parametrize("subgroups", [True, False], ids=["subgroup", "workgroup"])
@pytest.mark.parametrize("config", GEMV_CONFIGS, ids=lambda c: c.name.replace(" ", "-"))
def test_every_gemv_config_adds_the_residual_after_the_bias(monkeypatch, subgroups, config):
    _device_variant(monkeypatch, False, subgroups)   # f32 tiles; GEMVs never use f16
    _force_gemv(monkeypatch, lambda k, n: config)
    k = 2080   # 65 groups of 32: chunks per lane ragged for every layout
    fused, plain = _lowered("webgpu", k=k), _lowered("webgpu", "none", k=k)
    ran, _ = _same_bits(fused, plain, _inputs(1, k), "webgpu")
    assert ran == [f"{wq.GEMV} [linear_q4gsw]"]


def test_residual_binds_only_where_the_node_has_one():
    info = kernels_wgsl.BuildInfo(get_device(), ())
    attrs = {"group_size": GS, "K": K, "N": N}
    shapes = [(M_MAX, K), (N, K // 8), (K // GS, 68), (N,)]
    for ins, out in ((shapes, 4), (shapes + [(M_MAX, N)], 5)):
        for d in wq.linear_q4gsw(ins, [(M_MAX, N)], attrs, info):
            assert d.args[4] == out and d.writes == (out,)
            assert d.args[5] == (4 if out == 5 else None)
            assert ("HAS_RESIDUAL", int(out == 5)) in d.constants


def test_infer_rejects_a_residual_of_another_shape():
    op, attrs = get_op("linear_q4gsw"), {"group_size": GS, "K": K, "N": N}
    shapes = [(3, K), (N, K // 8), (K // GS, 68), None]
    assert op.infer(shapes + [(3, N)], attrs) == [(3, N)]
    with pytest.raises(DelegateError, match="linear_q4gsw residual"):
        op.infer(shapes + [(1, N)], attrs)


# ---- where it does not fire, and then changes nothing ------------------------------------------
class Unfusable(nn.Module):
    def __init__(self, fn, k=K, n=N, linears=1):
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(k, n, bias=False) for _ in range(linears))
        self.fn = fn

    def forward(self, x, r):
        return self.fn([p(x) for p in self.proj], r)


NO_MATCH = {   # name: (fn, r shape or None for [m, N])
    "linear-read-twice": (lambda ys, r: (ys[0] + r, ys[0]), None),
    "linear-scaled-too": (lambda ys, r: (ys[0] + r) * ys[0], None),
    "alpha-2": (lambda ys, r: torch.add(ys[0], r, alpha=2), None),
    "broadcast-r": (lambda ys, r: ys[0] + r, (N,)),
    "linear-plus-itself": (lambda ys, r: ys[0] + ys[0] + r, None),
    "sub": (lambda ys, r: ys[0] - r, None),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(NO_MATCH))
def test_unmatched_graph_lowers_byte_identically_with_the_pass_on_and_off(device, case):
    fn, r_shape = NO_MATCH[case]
    model = _quantized(Unfusable(fn), (GS,))
    on = _lower(model, device, r_shape=r_shape)
    off = _lower(model, device, "none", r_shape=r_shape)
    assert _blobs(on) == _blobs(off)
    x, r = torch.randn(5, K), torch.randn(r_shape or (5, N))
    outs, _ = _run(on, device, [x, r])
    want = model(x, r)
    for got, w in zip(outs, want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(got, w, **tol("q4gsw", "cpu" if device == "cpu" else
                                                 "webgpu"))


def test_fp32_linear_is_not_fused():
    model = LinearPlusResidual(K, N, True).eval()
    assert _blobs(_lower(model, "cpu")) == _blobs(_lower(model, "cpu", "none"))


@pytest.mark.parametrize("passes", [None, "residual_add"], ids=["all", "residual_add-only"])
def test_a_linear_fuse_linear_groups_keeps_its_add_whether_that_pass_runs_or_not(passes):
    """Two bias-free linears of one x (a gate/up pair), the first plus r: the multi-output op
    has no residual, so the add stays, and toggling fuse_linear changes only its own rewrite."""
    model = _quantized(Unfusable(lambda ys, r: (ys[0] + r, ys[1]), linears=2), (GS, GS))
    ops = _ops(_lower(model, "cpu", passes))
    assert ops == (["linear_q4gsw_multi", "add"] if passes is None
                   else ["linear_q4gsw", "linear_q4gsw", "add"])


def test_the_pass_is_switched_off_by_naming_the_others():
    pm = _lowered("cpu", ALL_BUT_THIS)
    assert _ops(pm) == ["linear_q4gsw", "add"]
    assert _blobs(pm) == _blobs(_lowered("cpu", "none"))


# ---- aliasing: the planner plans the fused IR --------------------------------------------------
class ResidualComputedBetween(nn.Module):
    """y = proj(x), then t = 2 r (x is dead by then, unfused), then y + t: an unfused plan is
    free to put t into x's bytes, which the fused node, standing at the add, still reads."""

    def __init__(self):
        super().__init__()
        self.proj = nn.ModuleList([nn.Linear(K, K, bias=True)])

    def forward(self, x, r):
        y = self.proj[0](x)
        return y + r * 2.0


@pytest.mark.parametrize("device", DEVICES)
def test_fused_node_reads_x_and_r_from_bytes_no_other_value_took(device):
    model = _quantized(ResidualComputedBetween(), (GS,))
    fused_pm, plain_pm = _lower(model, device, n=K), _lower(model, device, "none", n=K)
    plain = blob.decode(_blobs(plain_pm)[0])
    assert [n.op for n in plain.nodes] == ["linear_q4gsw", "mul", "add"]
    x, t = plain.nodes[0].inputs[0], plain.nodes[1].outputs[0]
    lives, offsets = _plan(plain)
    assert not lives[x].overlaps(lives[t]) and offsets[x] == offsets[t]

    fused = blob.decode(_blobs(fused_pm)[0])
    assert [n.op for n in fused.nodes] == ["mul", "linear_q4gsw"]
    x, t, out = fused.nodes[1].inputs[0], fused.nodes[1].inputs[4], fused.nodes[1].outputs[0]
    lives, offsets = _plan(fused)
    assert lives[x].overlaps(lives[t]) and lives[t].overlaps(lives[out])
    assert len({offsets[x], offsets[t], offsets[out]}) == 3
    _same_bits(fused_pm, plain_pm, _inputs(7, K, K), device)


# ---- ExecuTorch's own Llama ---------------------------------------------------------------------
def _residual_linears(pm) -> int:
    return sum(n.op == "linear_q4gsw" and len(n.inputs) == 5
               for b in _blobs(pm) for n in blob.decode(b).nodes)


@pytest.mark.parametrize("device", DEVICES)
def test_et_llama_folds_both_residual_adds_of_every_layer(device):
    from tests.test_llm_et import ARGS

    layers = ARGS["n_layers"]
    pairs = {"all passes": (_llama_lowered(device), _llama_lowered(device, ALL_BUT_THIS)),
             "this pass alone": (_llama_lowered(device, "residual_add"),
                                 _llama_lowered(device, "none"))}
    for on, off in pairs.values():
        # wo and w2 of every layer take their residual; the adds after them are gone
        assert _residual_linears(on) == 2 * layers and _residual_linears(off) == 0
        assert _ops(off).count("add") - _ops(on).count("add") == 2 * layers
        assert len(_ops(off)) - len(_ops(on)) == 2 * layers
    assert _ops(pairs["all passes"][0]).count("add") == 0


def _llama_steps() -> list:
    """A 7-token prefill, then 3 decode steps: (tokens, input_pos) per step."""
    torch.manual_seed(1)
    tokens = [torch.randint(0, 128, (1, 7))] + [torch.randint(0, 128, (1, 1)) for _ in range(3)]
    starts = [0, 7, 8, 9]
    return [(t, torch.tensor([p])) for t, p in zip(tokens, starts)]


def _step_logits(pm, device, steps) -> list:
    """The logits of each step, executed in order on one loaded program (its KV cache)."""
    from delegate.runtime import Runtime
    from tests.test_llm_et import _logits

    prog = Runtime.get().load_program(pm.buffer, device=device)
    try:
        method = prog.load_method("forward")
        return [_logits(method.execute([tokens, at])).clone() for tokens, at in steps]
    finally:
        prog.destroy()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("others", ["all passes", "none"])
def test_et_llama_logits_are_bit_identical_with_the_pass_toggled(device, others):
    """Prefill, then decode steps on the KV cache: only this pass toggled, the others all on
    or all off, every logit the same bits."""
    from tests.test_llm_et import _logits

    on, off = ((_llama_lowered(device), _llama_lowered(device, ALL_BUT_THIS))
               if others == "all passes"
               else (_llama_lowered(device, "residual_add"), _llama_lowered(device, "none")))
    steps = _llama_steps()
    got, want = _step_logits(on, device, steps), _step_logits(off, device, steps)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    model = _tiny_llama_int4()
    with torch.no_grad():
        eager = [_logits(model(tokens, {"input_pos": at})) for tokens, at in steps]
    for a, e in zip(got, eager):
        torch.testing.assert_close(a, e, **tol("model", device))


@pytest.mark.parametrize("t", [1, 7], ids=["decode", "prefill"])
def test_et_llama_runs_two_fewer_dispatches_per_layer(t):
    from tests.test_llm_et import ARGS

    inputs = [torch.randint(0, 128, (1, t)), torch.tensor([0])]
    _, fused = _run(_llama_lowered("webgpu"), "webgpu", inputs)
    _, plain = _run(_llama_lowered("webgpu", ALL_BUT_THIS), "webgpu", inputs)
    layers = ARGS["n_layers"]
    assert len(plain) - len(fused) == 2 * layers
    assert plain.count("binary [add]") - fused.count("binary [add]") == 2 * layers
    assert sum("linear_q4gsw" in r for r in plain) == sum("linear_q4gsw" in r for r in fused)

"""The fuse_linear pass (delegate/passes/fuse_linear.py): q4gsw linears of one input become one
linear_q4gsw_multi, bit-identical to the unfused linears on both executors.

Three references: the same model lowered with the passes off (torch.equal), an fp64
dequantize-then-matmul of torchao's qdata and scales (the q4gsw tolerance), and, for
ExecuTorch's own Llama, torchao's eager model (the model tolerance).
"""
import functools

import pytest
import torch
from torch import nn

import kernels_wgsl
from delegate import blob
from delegate.runtime import Runtime
from kernels_wgsl import q4gsw as wq
from tests.tolerances import tol

torchao = pytest.importorskip("torchao")
from torchao.quantization import IntxWeightOnlyConfig, quantize_  # noqa: E402
from torchao.quantization.granularity import PerGroup  # noqa: E402

from tests.test_q4gsw import golden  # noqa: E402

DEVICES = ["cpu", "webgpu"]
M_MAX = 9
# (K, group size, widths): attention q/k/v (GQA-shaped, and prime widths straddling the GEMV's
# 8-column and the scales' 4-column groups), MLP gate/up (equal, and ragged)
QKV = {"qkv": (64, 32, (96, 32, 32)), "qkv-ragged": (160, 32, (29, 11, 13))}
GATE_UP = {"gate-up": (64, 32, (128, 128)), "gate-up-ragged": (96, 32, (37, 19))}
SHAPES = {**QKV, **GATE_UP}


class Projections(nn.Module):
    """Bias-free (unless told) linears of one input x, or of x and y in turn."""

    def __init__(self, k, widths, bias=(), two_inputs=False):
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(k, w, bias=i in bias) for i, w in enumerate(widths))
        self.two_inputs = two_inputs

    def forward(self, x, y=None):
        ins = [x, y if self.two_inputs else x]
        return tuple(p(ins[i % 2]) for i, p in enumerate(self.proj))


def _quantized(model, group_sizes):
    torch.manual_seed(0)
    for p in model.modules():
        if isinstance(p, nn.Linear):
            p.weight.data.uniform_(-0.5, 0.5)
    for p, gs in zip(model.proj, group_sizes):
        quantize_(p, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(gs)))
    return model.eval()


@functools.lru_cache(maxsize=None)
def _model(k, gs, widths, bias=(), group_sizes=None, two_inputs=False):
    return _quantized(Projections(k, widths, bias, two_inputs), group_sizes or (gs,) * len(widths))


def _lower(model, example, device, passes=None, dynamic_shapes=None):
    from delegate.partitioner import WgpuPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    if dynamic_shapes is None:
        m = torch.export.Dim("m", min=1, max=M_MAX)
        dynamic_shapes = tuple({0: m} for _ in example)
    ep = torch.export.export(model, tuple(example), dynamic_shapes=dynamic_shapes)
    edge = to_edge_transform_and_lower(ep, partitioner=[WgpuPartitioner(device, passes=passes)],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return edge.to_executorch()


@functools.lru_cache(maxsize=None)
def _lowered(name, device, passes=None):
    k, gs, widths = SHAPES[name]
    return _lower(_model(k, gs, widths), (torch.randn(3, k),), device, passes)


def _blobs(pm) -> list:
    gm = pm.exported_program().graph_module
    return [m.processed_bytes for _, m in gm.named_children() if hasattr(m, "processed_bytes")]


def _ops(pm) -> list:
    return [n.op for b in _blobs(pm) for n in blob.decode(b).nodes]


def _run(pm, device, inputs) -> tuple:
    """(outputs, what the delegates ran: WGSL dispatches on webgpu, kernel calls on cpu) of
    one execute, each delegate's execute routed through its execute_profiled."""
    prog = Runtime.get().load_program(pm.buffer, device=device)
    try:
        method = prog.load_method("forward")
        outs = [t.clone() for t in method.execute(list(inputs))]
        ran = []
        for _, handle in method.delegates:
            def execute(ins, outputs=None, handle=handle):
                got, times, _ = type(handle).execute_profiled(handle, ins)
                ran.extend(label for label, _ in times)
                return got
            handle.execute = execute
        method.execute(list(inputs))
        return outs, ran
    finally:
        prog.destroy()


def _q4_runs(ran) -> list:
    return [r for r in ran if "linear_q4gsw" in r]


def _tol(device):
    if device == "cpu":
        return tol("q4gsw", "cpu")
    return tol("q4gsw", "webgpu" if kernels_wgsl.device.get_device().has_f16 else "webgpu-f32")


# ---- fires, bit-identical, fewer dispatches ------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(SHAPES))
def test_fused_ir_holds_one_multi_output_op(device, name):
    widths = SHAPES[name][2]
    assert _ops(_lowered(name, device)) == ["linear_q4gsw_multi"]
    assert _ops(_lowered(name, device, "none")) == ["linear_q4gsw"] * len(widths)
    graph = blob.decode(_blobs(_lowered(name, device))[0])
    assert graph.nodes[0].attrs["widths"] == list(widths)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [7, 1], ids=["gemm", "gemv"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_fused_outputs_are_bit_identical_to_unfused_in_one_dispatch(device, m, name):
    k, _, widths = SHAPES[name]
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k))
    fused, fused_ran = _run(_lowered(name, device), device, [x])
    plain, plain_ran = _run(_lowered(name, device, "none"), device, [x])
    assert [t.shape for t in fused] == [(m, w) for w in widths]
    assert all(torch.equal(a, b) for a, b in zip(fused, plain))
    assert len(_q4_runs(plain_ran)) == len(widths) and len(_q4_runs(fused_ran)) == 1
    if device == "webgpu":   # routed by live M exactly as the single-output op
        kernel = wq.GEMV if m == 1 else wq.GEMM
        assert fused_ran == [f"{kernel} [linear_q4gsw_multi]"]
        assert plain_ran == [f"{kernel} [linear_q4gsw]"] * len(widths)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 2, 9])
@pytest.mark.parametrize("name", list(SHAPES))
def test_fused_outputs_match_fp64_dequant_matmul(device, m, name):
    k, gs, widths = SHAPES[name]
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(3 * m))
    outs, _ = _run(_lowered(name, device), device, [x])
    for out, p in zip(outs, _model(k, gs, widths).proj):
        want = golden(x, p.weight.qdata, p.weight.scale, gs)
        torch.testing.assert_close(out.double(), want, **_tol(device))


def test_fused_gemm_on_the_128_tile_equals_unfused_on_the_64_tile(monkeypatch):
    """The two GEMM tiles share one reduction order: whichever the router picks for the
    fused N and for each unfused N, the bits agree."""
    k, _, widths = QKV["qkv-ragged"]
    x = torch.randn(M_MAX, k, generator=torch.Generator().manual_seed(11))
    monkeypatch.setattr(wq, "TILE128_MIN_M", 10**9)
    plain, plain_ran = _run(_lowered("qkv-ragged", "webgpu", "none"), "webgpu", [x])
    monkeypatch.setattr(wq, "TILE128_MIN_M", 2)
    monkeypatch.setattr(wq, "TILE128_MIN_TILES", 1)
    fused, fused_ran = _run(_lowered("qkv-ragged", "webgpu"), "webgpu", [x])
    assert plain_ran == [f"{wq.GEMM} [linear_q4gsw]"] * 3
    assert fused_ran == [f"{wq.GEMM128} [linear_q4gsw_multi]"]
    assert all(torch.equal(a, b) for a, b in zip(fused, plain))


@pytest.mark.parametrize("m", [1, 7])
def test_f16_tiles_and_subgroup_gemv_stay_bit_identical(monkeypatch, m):
    gpu = kernels_wgsl.device.get_device()
    if not (gpu.has_f16 and gpu.has_subgroups):
        pytest.skip(f"adapter {gpu.name}: lacks shader-f16 or subgroup")
    monkeypatch.setattr(wq, "TILES_F16", True)
    k, _, _ = QKV["qkv"]
    x = torch.randn(m, k)
    fused, ran = _run(_lowered("qkv", "webgpu"), "webgpu", [x])
    plain, _ = _run(_lowered("qkv", "webgpu", "none"), "webgpu", [x])
    assert ran == [f"{wq.GEMV if m == 1 else wq.GEMM} [linear_q4gsw_multi]"]
    assert all(torch.equal(a, b) for a, b in zip(fused, plain))


@pytest.mark.parametrize("device", DEVICES)
def test_five_linears_of_one_input_fuse_as_a_triple_and_a_pair(device):
    k, gs, widths = 64, 32, (24, 8, 16, 40, 8)
    model, x = _model(k, gs, widths), torch.randn(5, k)
    fused = _lower(model, (x,), device)
    assert _ops(fused) == ["linear_q4gsw_multi"] * 2
    assert [n.attrs["widths"] for n in blob.decode(_blobs(fused)[0]).nodes] == [[24, 8, 16],
                                                                                [40, 8]]
    got, _ = _run(fused, device, [x])
    want, _ = _run(_lower(model, (x,), device, "none"), device, [x])
    assert all(torch.equal(a, b) for a, b in zip(got, want))


# ---- no fire ----------------------------------------------------------------------------------
NO_MATCH = {
    "bias": dict(k=64, gs=32, widths=(32, 32), bias=(1,)),
    "group-sizes": dict(k=128, gs=32, widths=(32, 32), group_sizes=(32, 64)),
    "inputs": dict(k=64, gs=32, widths=(32, 32), two_inputs=True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(NO_MATCH))
def test_unmatched_linears_lower_byte_identically_with_the_pass_on_and_off(device, case):
    spec = NO_MATCH[case]
    model = _model(**spec)
    example = tuple(torch.randn(3, spec["k"]) for _ in range(2 if spec.get("two_inputs") else 1))
    on, off = _lower(model, example, device), _lower(model, example, device, "none")
    assert _ops(on) == ["linear_q4gsw", "linear_q4gsw"]
    assert _blobs(on) == _blobs(off)
    got, _ = _run(on, device, example)
    for out, want in zip(got, model(*example)):
        torch.testing.assert_close(out, want, **tol("q4gsw", "cpu" if device == "cpu" else
                                                     "webgpu"))


def test_the_pass_is_switched_off_by_naming_the_others():
    k, gs, widths = QKV["qkv"]
    pm = _lower(_model(k, gs, widths), (torch.randn(3, k),), "cpu", passes="fold_batch_norm")
    assert _ops(pm) == ["linear_q4gsw"] * 3


# ---- ExecuTorch's own Llama ---------------------------------------------------------------------
def _passes_without(*names) -> str:
    from delegate.passes import PASSES

    return ",".join(n for n in PASSES if n not in names) or "none"


# linear_swiglu takes the gate/up pair that fuse_linear would group (with its silu_mul) into
# one op of its own (tests/test_pass_linear_swiglu.py), and rms_norm_linear takes it with the
# norm before it (tests/test_pass_rms_norm_linear.py); here both stay off on both sides so the
# gate/up multi of this pass is what is counted and compared.
FUSED_SPEC = _passes_without("linear_swiglu", "rms_norm_linear")


def _all_passes_but_this_one() -> str:
    """The Llama graph also matches other passes (SwiGLU): the reference keeps them."""
    return _passes_without("fuse_linear", "linear_swiglu", "rms_norm_linear")


@functools.lru_cache(maxsize=None)
def _tiny_llama_int4():
    from tests.test_llm_et import tiny_llama

    model = tiny_llama()
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    return model


def _llama_lowered(device, passes=None):
    """The tiny Llama int4-g32 with its KV cache, tokens [1, T] (T dynamic) and input_pos,
    lowered once a session per (device, passes): test_llm_et's cache, shared by the pass
    tests (test_pass_residual_add.py, test_pass_linear_swiglu.py, ...)."""
    from tests.test_llm_et import llama_program

    return llama_program(device, quantize=True, passes=passes)


@pytest.mark.parametrize("device", DEVICES)
def test_et_llama_fuses_qkv_and_gate_up_and_matches(device):
    from tests.test_llm_et import ARGS, _logits

    model = _tiny_llama_int4()
    on = _llama_lowered(device, FUSED_SPEC)
    off = _llama_lowered(device, _all_passes_but_this_one())
    layers = ARGS["n_layers"]
    head = ARGS["dim"] // ARGS["n_heads"]
    multis = [n.attrs["widths"] for b in _blobs(on) for n in blob.decode(b).nodes
              if n.op == "linear_q4gsw_multi"]
    qkv = [ARGS["n_heads"] * head, ARGS["n_kv_heads"] * head, ARGS["n_kv_heads"] * head]
    assert multis == [qkv, [ARGS["hidden_dim"]] * 2] * layers
    # per layer: wo and w2 stay single, plus the LM head
    assert _ops(on).count("linear_q4gsw") == 2 * layers + 1
    # the fused program's state (KV cache) advances like the unfused one's: prefill, decode
    prog_on = Runtime.get().load_program(on.buffer, device=device)
    prog_off = Runtime.get().load_program(off.buffer, device=device)
    try:
        m_on, m_off = prog_on.load_method("forward"), prog_off.load_method("forward")
        torch.manual_seed(1)
        pos = 0
        for tokens in [torch.randint(0, 128, (1, 7))] + [torch.randint(0, 128, (1, 1))] * 2:
            at = torch.tensor([pos])
            with torch.no_grad():
                want = _logits(model(tokens, {"input_pos": at}))
            got = _logits(m_on.execute([tokens, at]))
            assert torch.equal(got, _logits(m_off.execute([tokens, at])))
            torch.testing.assert_close(got, want, **tol("model", device))
            pos += tokens.shape[1]
    finally:
        prog_on.destroy()
        prog_off.destroy()


@pytest.mark.parametrize("t", [7, 1], ids=["prefill", "decode"])
def test_et_llama_runs_three_fewer_dispatches_per_layer(t):
    from tests.test_llm_et import ARGS

    inputs = [torch.randint(0, 128, (1, t)), torch.tensor([0])]
    _, fused = _run(_llama_lowered("webgpu", FUSED_SPEC), "webgpu", inputs)
    _, plain = _run(_llama_lowered("webgpu", _all_passes_but_this_one()), "webgpu", inputs)
    layers = ARGS["n_layers"]
    assert len(_q4_runs(plain)) == 7 * layers + 1
    assert len(_q4_runs(fused)) == 4 * layers + 1
    assert len(plain) - len(fused) == 3 * layers

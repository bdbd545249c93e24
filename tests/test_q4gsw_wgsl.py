"""linear_q4gsw WGSL kernels on the WebGPU executor (lavapipe in CI), against the same fp64
dequantize-then-matmul golden as the CPU kernel. One executor per (N, K, gs, bias) with a
dynamic M runs every M of the grid, so both kernels and the per-execute routing are covered."""
import itertools

import pytest
import torch

import kernels_wgsl
from delegate.ir import Graph, Node, SymbolBinding, SymExpr, TensorValue
from delegate.ops.q4gsw import pack_q4gsw
from delegate.runtime.webgpu_executor import WebGpuExecutor
from kernels_wgsl import BuildInfo
from kernels_wgsl import q4gsw as wq
from tests.test_q4gsw import GSS, KS, MS, NS, golden, random_q4
from tests.tolerances import tol

M_MAX = max(MS)
CONFIGS = [(n, k, gs, bias) for n, k, gs, bias
           in itertools.product(NS, KS, GSS, (False, True)) if k % gs == 0]


def q4gsw_graph(n: int, k: int, gs: int, bias: bool, m_max: int = M_MAX, lead=()):
    """One linear_q4gsw node: x [*lead, m, K] (m dynamic) -> out [*lead, m, N]."""
    g = Graph()
    m = SymExpr("m")
    lead = tuple(lead)
    x = g.add_value(TensorValue(torch.float32, lead + (m, k), lead + (m_max, k)))
    packed = g.add_value(TensorValue(torch.int32, (n, k // 8), (n, k // 8), "packed"))
    n_pad = -(-n // 4) * 4
    scales = g.add_value(TensorValue(torch.float32, (k // gs, n_pad), (k // gs, n_pad), "scales"))
    b = g.add_value(TensorValue(torch.float32, (n,), (n,), "bias")) if bias else -1
    out = g.add_value(TensorValue(torch.float32, lead + (m, n), lead + (m_max, n)))
    g.nodes.append(Node("linear_q4gsw", [x, packed, scales, b], [out],
                        {"group_size": gs, "K": k, "N": n}))
    g.inputs, g.outputs = [x], [out]
    g.symbols.append(SymbolBinding("m", 0, len(lead)))
    return g


def weights_for(n, k, gs, bias, seed=0):
    qdata, scale = random_q4(n, k, gs, seed)
    packed, scales = pack_q4gsw(qdata, scale, gs)
    w = {"packed": packed, "scales": scales}
    b = torch.randn(n, generator=torch.Generator().manual_seed(seed)) if bias else None
    if bias:
        w["bias"] = b
    return qdata, scale, b, w


@pytest.fixture
def f32_only_device():
    """The device as one without shader-f16 would look: builders pick the all-f32 GEMM."""
    gpu = kernels_wgsl.device.get_device()
    had = gpu.has_f16
    gpu.has_f16 = False
    yield gpu
    gpu.has_f16 = had


def _tol():
    gpu = kernels_wgsl.device.get_device()
    return tol("q4gsw", "webgpu" if gpu.has_f16 else "webgpu-f32")


@pytest.mark.parametrize("n,k,gs,bias", CONFIGS)
def test_wgsl_kernels_match_fp64_dequant_matmul_at_every_m(n, k, gs, bias):
    qdata, scale, b, weights = weights_for(n, k, gs, bias, seed=n + k + gs)
    ex = WebGpuExecutor(q4gsw_graph(n, k, gs, bias), weights)
    try:
        for m in MS:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            got = ex.execute([x])[0]
            assert got.shape == (m, n)
            torch.testing.assert_close(got.double(), golden(x, qdata, scale, gs, b), **_tol(),
                                       msg=lambda e: f"M={m}: {e}")
    finally:
        ex.destroy()


@pytest.mark.parametrize("n,k,gs", [(72, 512, 128), (200, 64, 32)])
def test_all_f32_gemm_variant_matches_tighter(f32_only_device, n, k, gs):
    qdata, scale, b, weights = weights_for(n, k, gs, True, seed=3)
    ex = WebGpuExecutor(q4gsw_graph(n, k, gs, True), weights)
    try:
        labels = [d[1] for d in ex.dispatch_list()]
        assert "q4gsw_steel_gemm_f32" in labels
        for m in (2, 65):
            x = torch.randn(m, k)
            torch.testing.assert_close(ex.execute([x])[0].double(), golden(x, qdata, scale, gs, b),
                                       **tol("q4gsw", "webgpu-f32"))
    finally:
        ex.destroy()


def test_batched_activation_with_one_row_takes_the_gemv():
    n, k, gs = 40, 128, 64
    qdata, scale, _, weights = weights_for(n, k, gs, False)
    ex = WebGpuExecutor(q4gsw_graph(n, k, gs, False, m_max=9, lead=(1,)), weights)
    try:
        for m in (1, 9):
            x = torch.randn(1, m, k)
            torch.testing.assert_close(ex.execute([x])[0].double(), golden(x, qdata, scale, gs),
                                       **_tol())
    finally:
        ex.destroy()


@pytest.mark.parametrize("m,kernel", [(1, wq.GEMV), (2, wq.GEMM), (65, wq.GEMM)])
def test_live_m_routes_to_exactly_one_kernel(m, kernel):
    attrs = {"group_size": 64, "K": 128, "N": 200}
    info = BuildInfo(kernels_wgsl.device.get_device(), (torch.float32, torch.int32, torch.float32,
                                                        None))
    shapes = [(M_MAX, 128), (200, 16), (2, 200), None]
    dispatches = wq.linear_q4gsw(shapes, [(M_MAX, 200)], attrs, info)
    live = [(m, 128)] + shapes[1:]
    ran = [d.entry for d in dispatches if d.sizes(live, [(m, 200)], attrs)[1] > 0]
    assert ran == [kernel]


def test_weights_stay_packed_on_the_gpu():
    n, k, gs = 200, 512, 128
    _, _, _, weights = weights_for(n, k, gs, False)
    ex = WebGpuExecutor(q4gsw_graph(n, k, gs, False), weights)
    try:
        assert ex.describe()["weight_bytes"] <= 0.6 * n * k
    finally:
        ex.destroy()


def test_torchao_model_end_to_end_on_webgpu_matches_eager():
    from delegate.aot import lower
    from delegate.runtime import Runtime
    from tests.test_q4gsw import TwoLayers, lowered_ops, quantized

    model = quantized(TwoLayers(k=128, hidden=64, n=40), 32)
    rows = torch.export.Dim("m", min=1, max=17)
    pm = lower(model, (torch.randn(5, 128),), dynamic_shapes=({0: rows},), device="webgpu")
    assert lowered_ops(pm).count("linear_q4gsw") == 2
    method = Runtime.get().load_program(pm.buffer, device="webgpu").load_method("forward")
    for m in (1, 5, 17):   # the GEMV, then the GEMM, from the same loaded program
        x = torch.randn(m, 128)
        torch.testing.assert_close(method.execute([x])[0], model(x), **_tol())


def test_profile_shows_which_kernel_the_live_m_ran(tmp_path):
    from delegate.aot import lower
    from delegate.runtime.profile import profile_method
    from tests.test_q4gsw import quantized

    model = quantized(torch.nn.Sequential(torch.nn.Linear(64, 24)), 32)
    rows = torch.export.Dim("m", min=1, max=9)
    path = tmp_path / "q4.pte"
    path.write_bytes(lower(model, (torch.randn(3, 64),), dynamic_shapes=({0: rows},),
                           device="webgpu").buffer)
    decode = profile_method(str(path), inputs=[torch.randn(1, 64)], runs=1)
    prefill = profile_method(str(path), inputs=[torch.randn(9, 64)], runs=1)
    assert wq.GEMV in decode and wq.GEMM not in decode
    assert wq.GEMM in prefill and wq.GEMV not in prefill

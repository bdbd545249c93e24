"""linear_q4gsw WGSL kernels on the WebGPU executor (lavapipe in CI), against the same fp64
dequantize-then-matmul golden as the CPU kernel. One executor per (N, K, gs, bias) with a
dynamic M runs every M of the grid, so all three kernels and the per-binding routing are
covered, once per device variant: f16 tiles with the subgroup GEMV, and all-f32 with the
workgroup-memory GEMV. Every GEMV config (words per load, lanes, columns, unroll, x staging) is
tested on its own, on both reductions, and a layout's schedules and the fused op bit for bit."""
import itertools
from types import SimpleNamespace

import pytest
import torch

import kernels_wgsl
from delegate.errors import UnsupportedError
from delegate.ir import Graph, Node, SymbolBinding, SymExpr, TensorValue
from delegate.ops.q4gsw import pack_q4gsw
from delegate.runtime.webgpu_executor import WebGpuExecutor
from kernels_wgsl import BuildInfo
from kernels_wgsl import q4gsw as wq
from tests.test_q4gsw import golden, random_q4
from tests.tolerances import tol

# Prime-ish and ragged against every tile: 64x64 and 128x128 GEMM tiles, 4/8 GEMV columns.
MS = (1, 2, 63, 64, 65, 129, 257)
NS = (8, 36, 72, 136, 264)
KS, GSS = (64, 256), (32, 64, 128)
M_MAX = max(MS)
CONFIGS = [(n, k, gs, bias) for n, k, gs, bias
           in itertools.product(NS, KS, GSS, (False, True)) if k % gs == 0]
VARIANTS = {"f16+subgroup": (True, True), "f32+workgroup": (False, False)}
# One model-sized K, many K-steps and groups, on the all-f32 variant only: with f16 tiles the
# activations' rounding (2^-11 each, the 64x64 tile's as much as the 128x128 one's) sums to
# ~1e-2 absolute over K = 2048, past the "webgpu" row's atol, which was set at K <= 512.
GRID = ([(v,) + c for v in VARIANTS for c in CONFIGS]
        + [("f32+workgroup", 264, 2048, 128, True)])
ENTRY_FOR_M = {1: wq.GEMV, 2: wq.GEMM, 63: wq.GEMM}   # M >= 64: the 128x128 tile (forced below)


def q4gsw_graph(n: int, k: int, gs: int, bias: bool, m_max: int = M_MAX, lead=(),
                residual: bool = False):
    """One linear_q4gsw node: x [*lead, m, K] (m dynamic) -> out [*lead, m, N]; with a
    residual, a second input r [*lead, m, N] that the op adds."""
    g = Graph()
    m = SymExpr("m")
    lead = tuple(lead)
    x = g.add_value(TensorValue(torch.float32, lead + (m, k), lead + (m_max, k)))
    packed = g.add_value(TensorValue(torch.int32, (n, k // 8), (n, k // 8), "packed"))
    n_pad = -(-n // 4) * 4
    scales = g.add_value(TensorValue(torch.float32, (k // gs, n_pad), (k // gs, n_pad), "scales"))
    b = g.add_value(TensorValue(torch.float32, (n,), (n,), "bias")) if bias else -1
    r = [g.add_value(TensorValue(torch.float32, lead + (m, n), lead + (m_max, n)))] * residual
    out = g.add_value(TensorValue(torch.float32, lead + (m, n), lead + (m_max, n)))
    g.nodes.append(Node("linear_q4gsw", [x, packed, scales, b] + r, [out],
                        {"group_size": gs, "K": k, "N": n}))
    g.inputs, g.outputs = [x] + r, [out]
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


def _device_variant(monkeypatch, f16: bool, subgroups: bool):
    """The process-wide device as one with (or without) shader-f16 and subgroups looks to the
    builders; a feature the adapter lacks cannot be switched on."""
    gpu = kernels_wgsl.device.get_device()
    if (f16 and not gpu.has_f16) or (subgroups and not gpu.has_subgroups):
        pytest.skip(f"adapter {gpu.name}: lacks shader-f16 or subgroup")
    monkeypatch.setattr(gpu, "has_f16", f16)
    monkeypatch.setattr(wq, "TILES_F16", f16)
    monkeypatch.setattr(gpu, "has_subgroups", subgroups)
    return gpu


@pytest.fixture(params=list(VARIANTS))
def variant(request, monkeypatch):
    return _device_variant(monkeypatch, *VARIANTS[request.param])


@pytest.fixture
def f32_only_device(monkeypatch):
    """The device as one without shader-f16 or subgroups: the all-f32 GEMMs, the plain GEMV."""
    return _device_variant(monkeypatch, False, False)


def _tol(gpu=None):
    gpu = gpu or kernels_wgsl.device.get_device()
    return tol("q4gsw", "webgpu" if gpu.has_f16 else "webgpu-f32")


def _run(ex, x) -> tuple:
    """(output, entry points that ran) of one execute."""
    outs, times, _ = ex.execute_profiled([x])
    return outs[0], [label.split(" ")[0] for label, _ in times]


@pytest.mark.parametrize("variant_name,n,k,gs,bias", GRID)
def test_wgsl_kernels_match_fp64_dequant_matmul_at_every_m(monkeypatch, variant_name, n, k, gs,
                                                            bias):
    variant = _device_variant(monkeypatch, *VARIANTS[variant_name])
    monkeypatch.setattr(wq, "TILE128_MIN_TILES", 1)   # M >= 64 takes the 128x128 tile at any N
    monkeypatch.setattr(wq, "K_SPLIT", None)          # unsplit (split K: the tests below)
    qdata, scale, b, weights = weights_for(n, k, gs, bias, seed=n + k + gs)
    ex = WebGpuExecutor(q4gsw_graph(n, k, gs, bias), weights)
    try:
        for m in MS:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            got, ran = _run(ex, x)
            assert ran == [ENTRY_FOR_M.get(m, wq.GEMM128)]
            assert got.shape == (m, n)
            torch.testing.assert_close(got.double(), golden(x, qdata, scale, gs, b),
                                       **_tol(variant), msg=lambda e: f"M={m}: {e}")
    finally:
        ex.destroy()


@pytest.mark.parametrize("n,k,gs,bias", [(67, 256, 64, True), (36, 64, 32, False)])
def test_residual_epilogue_adds_r_after_the_bias_on_every_kernel(variant, monkeypatch, n, k, gs,
                                                                 bias):
    """out = (y + b) + r in f32 (delegate/passes/residual_add.py): the op without r, then r
    added in float32 on the host, bit for bit, on the GEMV and both tiles."""
    monkeypatch.setattr(wq, "TILE128_MIN_TILES", 1)
    _, _, _, weights = weights_for(n, k, gs, bias, seed=n)
    plain = WebGpuExecutor(q4gsw_graph(n, k, gs, bias), weights)
    fused = WebGpuExecutor(q4gsw_graph(n, k, gs, bias, residual=True), weights)
    try:
        for m in MS:
            x, r = torch.randn(m, k), torch.randn(m, n)
            outs, times, _ = fused.execute_profiled([x, r])
            assert [label.split(" ")[0] for label, _ in times] == [ENTRY_FOR_M.get(m, wq.GEMM128)]
            assert torch.equal(outs[0], plain.execute([x])[0] + r), f"M={m}"
    finally:
        plain.destroy()
        fused.destroy()


@pytest.mark.parametrize("n,k,gs", [(136, 256, 64), (36, 64, 32)])
def test_small_tile_gemm_covers_several_row_tiles(variant, monkeypatch, n, k, gs):
    monkeypatch.setattr(wq, "TILE128_MIN_M", 10**9)   # every M > 1 on the 64x64 tile
    qdata, scale, b, weights = weights_for(n, k, gs, True, seed=5)
    ex = WebGpuExecutor(q4gsw_graph(n, k, gs, True), weights)
    try:
        for m in (65, 129, 257):
            x = torch.randn(m, k)
            got, ran = _run(ex, x)
            assert ran == [wq.GEMM]
            torch.testing.assert_close(got.double(), golden(x, qdata, scale, gs, b),
                                       **_tol(variant), msg=lambda e: f"M={m}: {e}")
    finally:
        ex.destroy()


@pytest.mark.parametrize("n,k,gs", [(72, 512, 128), (200, 64, 32)])
def test_all_f32_gemm_variants_match_tighter(f32_only_device, monkeypatch, n, k, gs):
    monkeypatch.setattr(wq, "TILE128_MIN_TILES", 1)
    qdata, scale, b, weights = weights_for(n, k, gs, True, seed=3)
    ex = WebGpuExecutor(q4gsw_graph(n, k, gs, True), weights)
    try:
        labels = [d[1] for d in ex.dispatch_list()]
        assert {"q4gsw_steel_gemm_f32", "q4gsw_steel_gemm128_f32", wq.GEMV} <= set(labels)
        for m in (2, 65):
            x = torch.randn(m, k)
            torch.testing.assert_close(ex.execute([x])[0].double(), golden(x, qdata, scale, gs, b),
                                       **tol("q4gsw", "webgpu-f32"))
    finally:
        ex.destroy()


def test_gemv_takes_the_subgroup_sums_only_where_the_device_has_subgroups(monkeypatch):
    gpu = kernels_wgsl.device.get_device()
    info = BuildInfo(gpu, (torch.float32, torch.int32, torch.float32, None))
    attrs = {"group_size": 32, "K": 64, "N": 8}
    shapes = [(4, 64), (8, 8), (2, 8), None]
    for has in ((True, False) if gpu.has_subgroups else (False,)):
        monkeypatch.setattr(gpu, "has_subgroups", has)
        gemv = next(d for d in wq.linear_q4gsw(shapes, [(4, 8)], attrs, info) if d.entry == wq.GEMV)
        assert ("subgroupAdd" in gemv.prelude) == has
        assert gemv.label == wq.GEMV + ("_subgroup" if has else "")


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


def _entries_for(m: int, n: int, k: int = 2048, gpu=None) -> list:
    """Entry points the builder's dispatches run at live M (default thresholds)."""
    gpu = gpu or kernels_wgsl.device.get_device()
    attrs = {"group_size": 32, "K": k, "N": n}
    info = BuildInfo(gpu, (torch.float32, torch.int32, torch.float32, None))
    shapes = [(4096, k), (n, k // 8), (k // 32, -(-n // 4) * 4), None]
    dispatches = wq.linear_q4gsw(shapes, [(4096, n)], attrs, info)
    live = [(m, k)] + shapes[1:]
    return [d.entry for d in dispatches if d.sizes(live, [(m, n)], attrs)[1] > 0]


@pytest.mark.parametrize("m,n,kernel", [(1, 200, wq.GEMV), (2, 200, wq.GEMM), (65, 200, wq.GEMM),
                                        (63, 32768, wq.GEMM), (64, 32768, wq.GEMM128),
                                        (64, 8192, wq.GEMM), (512, 8192, wq.GEMM128),
                                        (512, 512, wq.GEMM), (2048, 512, wq.GEMM),
                                        (2048, 2048, wq.GEMM128), (1920, 2048, wq.GEMM)])
def test_live_m_routes_to_exactly_one_kernel(m, n, kernel):
    assert _entries_for(m, n) == [kernel]


@pytest.mark.parametrize("f16,storage,wide", [(False, 16384, True), (False, 8192, False),
                                              (True, 8192, True), (True, 4096, False)])
def test_128_tile_only_where_its_workgroup_memory_fits(f16, storage, wide, monkeypatch):
    monkeypatch.setattr(wq, "TILES_F16", f16)
    gpu = SimpleNamespace(has_f16=f16, has_subgroups=False,
                          limits={"max-compute-workgroup-storage-size": storage,
                                  "max-compute-invocations-per-workgroup": 256})
    assert _entries_for(512, 8192, gpu=gpu) == [wq.GEMM128 if wide else wq.GEMM]


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


@pytest.mark.parametrize("m", [1, 5, 65])   # the GEMV, the 64 tile and the 128 tile
def test_nan_and_inf_activations_propagate_like_eager(variant, monkeypatch, m):
    """A NaN in a row of x makes that output row NaN; an Inf gives Inf or, where it meets a
    zero weight or an opposite Inf, NaN: the NaN mask matches the fp64 golden's."""
    monkeypatch.setattr(wq, "TILE128_MIN_TILES", 1)
    n, k, gs = 72, 256, 64
    qdata, scale, _, w = weights_for(n, k, gs, False)
    ex = WebGpuExecutor(q4gsw_graph(n, k, gs, False), w)
    try:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
        x[0, 3] = float("nan")
        x[-1, 7] = float("inf")
        if m > 2:
            x[1, 11] = -float("inf")
        got, _ = _run(ex, x)
        want = golden(x, qdata, scale, gs)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.isinf(), want.isinf())
        finite = want.isfinite()
        torch.testing.assert_close(got[finite].double(), want[finite], **_tol())
    finally:
        ex.destroy()


# ---- the GEMV's configs (kernels_wgsl/q4gsw.py GemvConfig) -------------------------------------
# Every chunk width, lanes from 32 to 256, 4/8/16 columns, unroll 1/2/4, x staged or not.
GEMV_CONFIGS = [wq.GemvConfig(*c) for c in [
    (1, 64, 8, 4, False), (1, 32, 4, 1, False), (1, 128, 16, 2, False), (1, 256, 4, 4, False),
    (2, 32, 8, 4, False), (2, 64, 16, 1, True), (2, 128, 4, 2, True),
    (4, 32, 16, 1, False), (4, 64, 4, 4, True), (4, 32, 8, 2, True)]]
# (N, K, gs, bias): chunks per lane ragged for every width (K = 2080 = 32 * 65), N below one
# workgroup's columns and off the scales' 4, fewer chunks than lanes, every group size.
GEMV_SHAPES = [(37, 2080, 32, True), (13, 384, 128, False), (264, 192, 64, True),
               (8, 64, 32, False), (20, 512, 256, True)]
REDUCTIONS = {"subgroup": True, "workgroup": False}


def _force_gemv(monkeypatch, pick):
    """Route every GEMV the builders make to pick(k, n), a GemvConfig."""
    monkeypatch.setattr(wq, "gemv_config", lambda k, n, gpu, subgroups, norm=False: pick(k, n))


def _gemv_out(graph, weights, x) -> torch.Tensor:
    ex = WebGpuExecutor(graph, weights)
    try:
        outs, times, _ = ex.execute_profiled([x])
        assert [label.split(" ")[0] for label, _ in times] == [wq.GEMV]
        return outs
    finally:
        ex.destroy()


@pytest.mark.parametrize("reduction", list(REDUCTIONS))
@pytest.mark.parametrize("n,k,gs,bias", GEMV_SHAPES)
@pytest.mark.parametrize("config", GEMV_CONFIGS, ids=lambda c: c.name.replace(" ", "-"))
def test_every_gemv_config_matches_fp64_dequant_matmul(monkeypatch, reduction, n, k, gs, bias,
                                                       config):
    _device_variant(monkeypatch, False, REDUCTIONS[reduction])
    _force_gemv(monkeypatch, lambda k, n: config)
    qdata, scale, b, weights = weights_for(n, k, gs, bias, seed=n + k)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k))
    got = _gemv_out(q4gsw_graph(n, k, gs, bias, m_max=2), weights, x)[0]
    torch.testing.assert_close(got.double(), golden(x, qdata, scale, gs, b),
                               **tol("q4gsw", "webgpu-f32"))


@pytest.mark.parametrize("reduction", list(REDUCTIONS))
@pytest.mark.parametrize("words,lanes", [(1, 64), (2, 32), (4, 32)])
def test_gemv_schedule_changes_no_output_bit(monkeypatch, reduction, words, lanes):
    """cols, unroll and x staging move work between lanes' registers and loop steps, never
    between the terms of a column's sum: one layout, one output."""
    _device_variant(monkeypatch, False, REDUCTIONS[reduction])
    n, k, gs = 37, 2080, 32
    _, _, _, weights = weights_for(n, k, gs, True)
    x = torch.randn(1, k)
    outs = []
    for cols, unroll, staged in [(4, 1, False), (8, 2, words > 1), (16, 4, False), (16, 1, True)]:
        config = wq.GemvConfig(words, lanes, cols, unroll, staged)
        _force_gemv(monkeypatch, lambda k, n: config)
        outs.append(_gemv_out(q4gsw_graph(n, k, gs, True, m_max=2), weights, x)[0])
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def q4gsw_multi_graph(k: int, gs: int, widths, m_max: int = 2):
    """One linear_q4gsw_multi node: x [m, K] -> one output per width."""
    g = Graph()
    n, m = sum(widths), SymExpr("m")
    x = g.add_value(TensorValue(torch.float32, (m, k), (m_max, k)))
    packed = g.add_value(TensorValue(torch.int32, (n, k // 8), (n, k // 8), "packed"))
    n_pad = -(-n // 4) * 4
    scales = g.add_value(TensorValue(torch.float32, (k // gs, n_pad), (k // gs, n_pad), "scales"))
    outs = [g.add_value(TensorValue(torch.float32, (m, w), (m_max, w))) for w in widths]
    g.nodes.append(Node("linear_q4gsw_multi", [x, packed, scales], outs,
                        {"group_size": gs, "K": k, "N": n, "widths": list(widths)}))
    g.inputs, g.outputs = [x], outs
    g.symbols.append(SymbolBinding("m", 0, 0))
    return g


@pytest.mark.parametrize("reduction", list(REDUCTIONS))
def test_fused_gemv_on_other_columns_per_workgroup_equals_unfused(monkeypatch, reduction):
    """The fused op's wider N may take another schedule (here 16 columns, x staged, against 4):
    each output still has the bits of its own linear_q4gsw."""
    _device_variant(monkeypatch, False, REDUCTIONS[reduction])
    k, gs, widths = 2080, 32, (29, 11, 13)
    _force_gemv(monkeypatch, lambda k, n: wq.GemvConfig(4, 32, 16 if n > 40 else 4,
                                                        1 if n > 40 else 2, n > 40))
    parts = [random_q4(w, k, gs, seed=i) for i, w in enumerate(widths)]
    packed, scales = pack_q4gsw(torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts]),
                                gs)
    x = torch.randn(1, k)
    fused = _gemv_out(q4gsw_multi_graph(k, gs, widths), {"packed": packed, "scales": scales}, x)
    for (q, s), got in zip(parts, fused):
        p, sc = pack_q4gsw(q, s, gs)
        want = _gemv_out(q4gsw_graph(len(q), k, gs, False, m_max=2),
                         {"packed": p, "scales": sc}, x)[0]
        assert torch.equal(got, want)


@pytest.mark.parametrize("k", [64, 2048, 2080, 8192, 14336])
def test_gemv_layout_follows_k_alone(k):
    """words and lanes fix a column's bits: every N of one K routes to the same layout."""
    gpu = kernels_wgsl.device.get_device()
    configs = [wq.gemv_config(k, n, gpu, sg) for n in (8, 512, 3072, 16384, 128256)
               for sg in (False, True)]
    assert len({(c.words, c.lanes) for c in configs}) == 1


# The H200 sweep's best layouts (bench/results/q4gsw_gemv_sweep_h200.txt, a Llama-3.2-1B
# decode step): vec2<u32> loads, 32 lanes at K = 2048 (447.3 against 472.9 us for w1 l64) and
# 128 at K = 8192 (145.6 against 150.6 us for w1 l256).
@pytest.mark.parametrize("k,lanes", [(64, 32), (2048, 32), (4096, 64), (8192, 128),
                                     (14336, 256)])
def test_gemv_lanes_grow_with_k(k, lanes):
    gpu = kernels_wgsl.device.get_device()
    config = wq.gemv_config(k, 2048, gpu, False)
    assert (config.words, config.lanes) == (2, lanes)


# The same sweep's schedules at K = 2048 (the comment at GEMV_WIDE_N): c4 u4 up to the FFN,
# c8 u1 for the LM head.
@pytest.mark.parametrize("n,cols,unroll", [(2048, 4, 4), (3072, 4, 4), (8192, 4, 4),
                                           (16384, 4, 4), (128256, 8, 1)])
def test_gemv_schedule_follows_the_h200_sweep(n, cols, unroll):
    gpu = SimpleNamespace(limits={"max-compute-invocations-per-workgroup": 1024,
                                  "max-compute-workgroup-size-x": 1024,
                                  "max-compute-workgroup-storage-size": 49152})
    config = wq.gemv_config(2048, n, gpu, True)
    assert (config.words, config.lanes, config.cols, config.unroll) == (2, 32, cols, unroll)


@pytest.mark.parametrize("subgroups", [False, True])
def test_routed_gemv_fits_webgpus_default_limits(subgroups):
    gpu = SimpleNamespace(limits={"max-compute-invocations-per-workgroup": 256,
                                  "max-compute-workgroup-size-x": 256,
                                  "max-compute-workgroup-storage-size": 16384})
    for k, n in itertools.product((64, 2048, 8192, 65536), (8, 3072, 128256)):
        assert wq.gemv_config(k, n, gpu, subgroups).fits(gpu, subgroups)


def test_gemv_lanes_past_the_device_limit_fall_back_to_64():
    gpu = SimpleNamespace(limits={"max-compute-invocations-per-workgroup": 128,
                                  "max-compute-workgroup-size-x": 128})
    assert wq.gemv_config(14336, 2048, gpu, True).lanes == 64   # routed: 256 lanes


@pytest.mark.parametrize("bad", [dict(words=3), dict(lanes=48), dict(lanes=16), dict(cols=12),
                                 dict(unroll=3)])
def test_gemv_config_rejects_what_the_kernel_cannot_build(bad):
    with pytest.raises(UnsupportedError, match="GEMV config"):
        wq.GemvConfig(**bad)


# ---- split K (kernels_wgsl/q4gsw.py K_SPLIT) ------------------------------------------------
# K_SPLIT is shrunk so that lavapipe-sized K split: K = 224 is 3 chunks of 64 and a ragged 32,
# K = 256 four whole ones; chunks start inside a group where gs > 64.
SPLIT = 64
SPLIT_CONFIGS = [(67, 224, 32, True), (136, 256, 128, False), (8, 256, 64, True)]
SPLIT_ENTRIES = [wq.GEMM128, "q4gsw_splitk_reduce"]


def _split_entries(m: int) -> list:
    return [wq.GEMV] if m == 1 else [wq.GEMM] if m < wq.TILE128_MIN_M else SPLIT_ENTRIES


@pytest.mark.parametrize("n,k,gs,bias", SPLIT_CONFIGS)
def test_split_k_matches_fp64_dequant_matmul_at_every_m(variant, monkeypatch, n, k, gs, bias):
    monkeypatch.setattr(wq, "K_SPLIT", SPLIT)
    qdata, scale, b, weights = weights_for(n, k, gs, bias, seed=n + k)
    ex = WebGpuExecutor(q4gsw_graph(n, k, gs, bias), weights)
    try:
        for m in MS:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            got, ran = _run(ex, x)
            assert ran == _split_entries(m), f"M={m}"
            torch.testing.assert_close(got.double(), golden(x, qdata, scale, gs, b),
                                       **_tol(variant), msg=lambda e: f"M={m}: {e}")
    finally:
        ex.destroy()


def test_split_k_sums_the_chunks_in_order(f32_only_device, monkeypatch):
    """A split output is the unsplit chain of each chunk, then the chunks added in order: the
    same sums in float32 on the host, from single-chunk runs of each chunk's weights, match it
    bit for bit (the scales of the other chunks' groups zeroed)."""
    monkeypatch.setattr(wq, "K_SPLIT", SPLIT)
    n, k, gs = 36, 224, 32
    qdata, scale, _, weights = weights_for(n, k, gs, False, seed=9)
    x = torch.randn(65, k, generator=torch.Generator().manual_seed(2))
    ex = WebGpuExecutor(q4gsw_graph(n, k, gs, False), weights)
    try:
        got, ran = _run(ex, x)
    finally:
        ex.destroy()
    assert ran == SPLIT_ENTRIES
    monkeypatch.setattr(wq, "K_SPLIT", None)
    total = None
    for k0 in range(0, k, SPLIT):   # chunk c alone: x's other columns zeroed
        xc = torch.zeros_like(x)
        xc[:, k0:k0 + SPLIT] = x[:, k0:k0 + SPLIT]
        part = _chunk_run(n, k, gs, weights, xc, k0)
        total = part if total is None else total + part
    assert torch.equal(got, total)


def _chunk_run(n, k, gs, weights, x, k0) -> torch.Tensor:
    """The unsplit 128x128 tile over x whose only nonzero columns start at k0: an FMA chain
    that adds exact zeros before k0 gives the chunk's own chain (zero + p == p exactly; after
    the chunk, + 0 * w leaves it unchanged)."""
    ex = WebGpuExecutor(q4gsw_graph(n, k, gs, False), weights)
    try:
        got, ran = _run(ex, x)
    finally:
        ex.destroy()
    assert ran == [wq.GEMM128] or ran == [wq.GEMM]
    return got


@pytest.mark.parametrize("n,k,gs,bias", [(67, 256, 64, True), (36, 224, 32, False)])
def test_split_k_residual_epilogue_adds_r_after_the_bias(variant, monkeypatch, n, k, gs, bias):
    monkeypatch.setattr(wq, "K_SPLIT", SPLIT)
    _, _, _, weights = weights_for(n, k, gs, bias, seed=n)
    plain = WebGpuExecutor(q4gsw_graph(n, k, gs, bias), weights)
    fused = WebGpuExecutor(q4gsw_graph(n, k, gs, bias, residual=True), weights)
    try:
        for m in (64, 129):
            x, r = torch.randn(m, k), torch.randn(m, n)
            outs, times, _ = fused.execute_profiled([x, r])
            assert [label.split(" ")[0] for label, _ in times] == SPLIT_ENTRIES
            assert torch.equal(outs[0], plain.execute([x])[0] + r), f"M={m}"
    finally:
        plain.destroy()
        fused.destroy()


@pytest.mark.parametrize("widths", [(29, 11, 13), (96, 32, 32), (40, 8)])
def test_split_k_fused_multi_keeps_each_linears_bits(variant, monkeypatch, widths):
    """Split K is decided by K and M alone: the fused N splits where each unfused N does."""
    monkeypatch.setattr(wq, "K_SPLIT", SPLIT)
    k, gs = 224, 32
    parts = [random_q4(w, k, gs, seed=i) for i, w in enumerate(widths)]
    packed, scales = pack_q4gsw(torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts]),
                                gs)
    fused = WebGpuExecutor(q4gsw_multi_graph(k, gs, widths, m_max=M_MAX),
                           {"packed": packed, "scales": scales})
    plains = [WebGpuExecutor(q4gsw_graph(len(q), k, gs, False), dict(zip(
        ("packed", "scales"), pack_q4gsw(q, s, gs)))) for q, s in parts]
    try:
        for m in (2, 63, 64, 257):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            outs, times, _ = fused.execute_profiled([x])
            assert [label.split(" ")[0] for label, _ in times] == _split_entries(m)
            for got, plain in zip(outs, plains):
                assert torch.equal(got, plain.execute([x])[0]), f"M={m}"
    finally:
        for ex in [fused, *plains]:
            ex.destroy()


def test_split_k_only_where_the_partials_fit_and_m_reaches_the_tile(monkeypatch):
    gpu = kernels_wgsl.device.get_device()
    attrs = {"group_size": 32, "K": 8192, "N": 2048}
    shapes = [(512, 8192), (2048, 1024), (256, 2048), None]
    entries = lambda info: {d.entry for d in wq.linear_q4gsw(shapes, [(512, 2048)], attrs,  # noqa
                                                             info)}
    info = BuildInfo(gpu, (torch.float32, torch.int32, torch.float32, None), scratch=True)
    split = next(d for d in wq.linear_q4gsw(shapes, [(512, 2048)], attrs, info)
                 if d.entry == "q4gsw_splitk_reduce")
    assert split.scratch == (wq.k_splits(8192) * 512 * 2048 * 4,)
    assert "q4gsw_splitk_reduce" not in entries(BuildInfo(gpu, info.in_dtypes))   # no scratch
    small = SimpleNamespace(has_f16=False, has_subgroups=False,
                            limits={**gpu.limits, "max-storage-buffer-binding-size": 1 << 20})
    assert "q4gsw_splitk_reduce" not in entries(BuildInfo(small, info.in_dtypes, scratch=True))
    decode_only = [(wq.TILE128_MIN_M - 1, 8192)] + shapes[1:]
    assert not any(d.entry == "q4gsw_splitk_reduce" for d in
                   wq.linear_q4gsw(decode_only, [(63, 2048)], attrs, info))

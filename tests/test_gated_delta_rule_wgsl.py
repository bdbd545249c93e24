"""Gated delta rule on WebGPU (lavapipe in CI) against a float64 token loop written here.

Single-op graphs run through the WebGPU executor. T = 1 takes the recurrent kernel; longer T
the chunked route (chunk_prep + chunk_scan, chunks of 32), whose flagged chunks (a decay of 0,
decays near 1e-12) run token by token inside chunk_scan. Errors are relative to max |reference|,
with the "webgpu" entry of the gated_delta_rule row of tests/tolerances.py."""
import pytest
import torch

import kernels_wgsl
from delegate.errors import UnsupportedError
from kernels_wgsl import gated_delta_rule as gdr
from tests.test_kernels_wgsl import run_wgsl, single_op_graph
from tests.tolerances import tol

RTOL = tol("gated_delta_rule", "webgpu")["rtol"]
SEQ_LENS = (1, 2, 31, 63, 64, 65, 130, 257)


def reference(q, k, v, decay, beta, s0):
    """S = diag(d) S; δ = β (v - k^T S); S += k δ^T; o = S^T q, one token at a time, float64."""
    q, k, v, decay, beta, s = (t.double() for t in (q, k, v, decay, beta, s0))
    B, Hq, T, K = q.shape
    Hs, V = k.shape[1], v.shape[3]
    G = Hq // Hs
    d = decay if decay.dim() == 4 else decay.unsqueeze(-1).expand(B, Hs, T, K)
    out = torch.empty(B, Hq, T, V, dtype=torch.float64)
    for t in range(T):
        s = d[:, :, t, :, None] * s
        delta = beta[:, :, t, None] * (v[:, :, t] - (k[:, :, t, :, None] * s).sum(2))
        s = s + k[:, :, t, :, None] * delta[:, :, None, :]
        for h in range(Hq):
            out[:, h, t] = (q[:, h, t, :, None] * s[:, h // G]).sum(1)
    return out, s


def make_inputs(T, B=2, Hq=2, Hs=2, K=5, V=6, scalar=False, decay="random", seed=0):
    g = torch.Generator().manual_seed(seed)
    dshape = (B, Hs, T) if scalar else (B, Hs, T, K)
    d = {
        "random": lambda: torch.rand(dshape, generator=g) * 0.998 + 0.001,
        "one": lambda: torch.ones(dshape),
        "zero": lambda: torch.zeros(dshape),
        "tiny": lambda: torch.full(dshape, 1e-12),
    }[decay]()
    return [
        torch.randn(B, Hq, T, K, generator=g),
        torch.randn(B, Hs, T, K, generator=g) / K ** 0.5,
        torch.randn(B, Hs, T, V, generator=g),
        d,
        torch.rand(B, Hs, T, generator=g),
        torch.randn(B, Hs, K, V, generator=g),
    ]


def assert_matches_reference(inputs):
    out, state = run_wgsl("gated_delta_rule", inputs, {})
    ref_out, ref_state = reference(*inputs)
    for name, got, want in (("out", out, ref_out), ("final_state", state, ref_state)):
        assert torch.isfinite(got).all(), f"{name}: non-finite values"
        err = (got.double() - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
        assert err <= RTOL, f"{name}: relative error {err:.2e} > {RTOL}"


@pytest.mark.parametrize("T", SEQ_LENS)
@pytest.mark.parametrize("scalar", [False, True], ids=["channelwise", "scalar"])
def test_random_decay_matches_reference(T, scalar):
    assert_matches_reference(make_inputs(T, scalar=scalar))


@pytest.mark.parametrize("T", SEQ_LENS)
def test_grouped_query_heads_share_state(T):
    assert_matches_reference(make_inputs(T, Hq=4, Hs=2))


@pytest.mark.parametrize("T", (1, 65))
def test_model_sized_heads_match_reference(T):
    assert_matches_reference(make_inputs(T, B=1, Hq=4, Hs=2, K=128, V=128))


def test_widest_heads_and_k_unequal_v():
    """K = 256 takes the 32-lane layout; V = 200 leaves a partial value block."""
    assert_matches_reference(make_inputs(65, B=1, Hq=2, Hs=1, K=256, V=200, scalar=True))


@pytest.mark.parametrize("T", (1, 31, 65, 130))
def test_beta_zero_keeps_decayed_state(T):
    inputs = make_inputs(T, Hq=4, Hs=2)
    inputs[4] = torch.zeros_like(inputs[4])
    assert_matches_reference(inputs)


@pytest.mark.parametrize("T", (1, 64, 65, 130))
@pytest.mark.parametrize("decay", ["one", "zero", "tiny"])
@pytest.mark.parametrize("scalar", [False, True], ids=["channelwise", "scalar"])
def test_extreme_decay_matches_reference(T, decay, scalar):
    assert_matches_reference(make_inputs(T, scalar=scalar, decay=decay))


@pytest.mark.parametrize("value", [0.0, 1e-12, 1.0])
def test_extreme_decay_over_one_whole_chunk(value):
    """Tokens 32..63 (chunk 1) take the exact route or not; the chunks around them do not."""
    inputs = make_inputs(130, Hq=4, Hs=2)
    inputs[3][:, :, 32:64] = value
    assert_matches_reference(inputs)


def test_flag_of_an_exact_chunk_does_not_leak_into_later_runs():
    """Workgroup memory is not zeroed on every driver: an all-flagged run, then ordinary ones."""
    assert_matches_reference(make_inputs(64, decay="tiny"))
    assert_matches_reference(make_inputs(64))


@pytest.mark.parametrize("T", (2, 65))
def test_token_recurrence_handles_any_length(T, monkeypatch):
    """The recurrent kernel alone (the route without scratch) over a whole prefill."""
    monkeypatch.setattr(gdr, "DECODE_MAX_T", 10 ** 9)
    assert_matches_reference(make_inputs(T, Hq=4, Hs=2))


def test_segments_carry_the_state_between_them(monkeypatch):
    """A scratch budget of one chunk: 130 tokens run as 5 prep/scan segments."""
    monkeypatch.setattr(gdr, "SCRATCH_BUDGET", 1)
    assert_matches_reference(make_inputs(130, Hq=4, Hs=2))


@pytest.mark.parametrize("columns, rows", [(4, 1), (8, 2), (16, 8), (16, 32), (32, 16)])
def test_scan_tiles_of_any_width_and_staged_rows(columns, rows, monkeypatch):
    """chunk_scan with BV value columns per workgroup and TC chunk rows staged at a time (the
    device's workgroup memory picks them); chunk 1 takes the exact route in between."""
    monkeypatch.setattr(gdr, "SCAN_COLUMNS", (columns,))
    monkeypatch.setattr(gdr, "SCAN_ROWS", (rows,))
    inputs = make_inputs(130, Hq=4, Hs=2, K=24, V=20)
    inputs[3][:, :, 32:64] = 1e-12
    assert_matches_reference(inputs)


@pytest.mark.parametrize("K, V", [(128, 128), (256, 200)])
def test_scan_fits_the_guaranteed_16_kib_of_workgroup_memory(K, V, monkeypatch):
    """WebGPU guarantees 16 KiB: the scan narrows its column block and stages fewer rows."""
    from kernels_wgsl.device import get_device

    monkeypatch.setitem(get_device().limits, "max-compute-workgroup-storage-size", 16384)
    assert_matches_reference(make_inputs(65, B=1, Hq=2, Hs=1, K=K, V=V))


def test_scan_tile_is_the_widest_that_fits():
    h = gdr.Heads(128, 128, 1, 128)
    assert gdr.scan_tile(h, 49152) == gdr.ScanTile(16, 32)    # the H200's 48 KiB
    for k in (1, 5, 64, 128, 256):
        for g in (1, 4):
            tile = gdr.scan_tile(gdr.Heads(k, 256, g, k), 16384)
            assert gdr.scan_bytes(gdr.Heads(k, 256, g, k), tile) <= 16384


@pytest.mark.parametrize("V", [22, 140])
def test_value_columns_past_the_last_full_block(V):
    """V = 22: a scan block of 16 and one of 6 (a partial vec4); V = 140: nine scan blocks,
    the last of 12 columns, and two output blocks of 128 and 12."""
    assert_matches_reference(make_inputs(65, Hq=4, Hs=2, K=8, V=V))


def test_values_narrower_than_one_block():
    assert_matches_reference(make_inputs(65, Hq=2, Hs=1, K=7, V=3))


def test_live_heads_must_match_the_loaded_ones():
    specs, shapes, outs = _build(make_inputs(65))
    other = [tuple(t.shape) for t in make_inputs(65, K=8)]
    with pytest.raises(UnsupportedError, match="live heads"):
        specs[1].sizes(other, outs, {})


def test_initial_state_buffer_is_not_written():
    from delegate.runtime.webgpu_executor import WebGpuExecutor

    inputs = make_inputs(65, Hq=4, Hs=2)
    graph, weights, feed = single_op_graph("gated_delta_rule", inputs, {})
    ex = WebGpuExecutor(graph, weights)
    try:
        ex.execute(feed)
        buf = ex._buffer_of(graph.inputs[5])
        raw = ex._gpu.device.queue.read_buffer(buf)
        s0 = torch.frombuffer(bytearray(raw), dtype=torch.float32)[:inputs[5].numel()]
        assert torch.equal(s0.view_as(inputs[5]), inputs[5])
    finally:
        ex.destroy()


def _build(ins, scratch=True):
    from kernels_wgsl.device import get_device

    shapes = [tuple(t.shape) for t in ins]
    info = kernels_wgsl.BuildInfo(get_device(), (torch.float32,) * 6, scratch=scratch)
    outs = [(*shapes[0][:3], shapes[2][3]), shapes[5]]
    return kernels_wgsl.get_kernel("gated_delta_rule").build(shapes, outs, {}, info), shapes, outs


def test_live_length_routes_the_dispatches():
    """Decode runs the recurrence alone; a prefill copies the carry, then prep, scan, out."""
    specs, shapes, outs = _build(make_inputs(130))
    assert [s.entry for s in specs] == ["recurrent", "chunk_prep", "chunk_scan", "chunk_out"]
    decode = [tuple(t.shape) for t in make_inputs(1)]
    assert [s.sizes(decode, outs, {})[1] > 0 for s in specs] == [True, False, False, False]
    assert all(s.sizes(shapes, outs, {})[1] > 0 for s in specs)


def test_without_scratch_every_length_runs_the_recurrence():
    specs, _, _ = _build(make_inputs(130), scratch=False)
    assert [s.entry for s in specs] == ["recurrent"]


def test_heads_wider_than_256_are_refused():
    with pytest.raises(UnsupportedError, match="K, V <= 256"):
        _build(make_inputs(2, B=1, Hq=1, Hs=1, K=260, V=4))


@pytest.mark.parametrize("T", [1, 40])   # the recurrent route and the chunked one
@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_nan_propagates_like_the_token_loop(T, where):
    """A NaN in q spoils only that token's output; in k or v it enters the state, and every
    later output and the final state of that head are NaN: the NaN masks match the float64
    token loop's (the chunked route included: no NaN reaches the chunk's earlier tokens), and
    the finite values match it too. (An Inf is left out: whether inf - inf or inf * 0 comes
    first is a matter of association, where the loop and the chunked form differ.)"""
    inputs = make_inputs(T)
    t = T // 2
    arg = {"query": 0, "key": 1, "value": 2}[where]
    inputs[arg][0, 0, t, 1] = float("nan")
    out, state = run_wgsl("gated_delta_rule", inputs, {})
    ref_out, ref_state = reference(*inputs)
    for name, got, want in (("out", out, ref_out), ("final_state", state, ref_state)):
        assert torch.equal(got.isnan(), want.isnan()), name
        finite = want.isfinite()
        err = (got.double()[finite] - want[finite]).abs().max().item()
        assert err <= RTOL * max(want[finite].abs().max().item(), 1e-30), name

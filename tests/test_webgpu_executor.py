"""The WebGPU executor as a whole: buffer planning and aliasing, dispatch order, dynamic shapes,
grid folding, ownership across load/destroy, device choice and driver errors. Runs for real on
lavapipe in CI; nothing here skips."""
import logging

import pytest
import torch

from bench.load_destroy import block_graph, live_wgpu_objects, run, settle
from delegate.errors import DelegateError, DeviceError, InputError, ShaderError
from delegate.ir import Graph, Node, SymExpr, SymbolBinding, TensorValue
from delegate.runtime import webgpu_executor
from delegate.runtime.webgpu_executor import WebGpuExecutor
from kernels_wgsl import device as wgsl_device
from tests.test_kernels_wgsl import single_op_graph
from tests.tolerances import tol


def chain_graph():
    """x -> relu -> a (output) -> exp -> b -> neg -> c -> mul(c, c) -> d (output), plus a view.

    `a` is an output produced first; every later value could reuse its buffer if the planner
    let it, which is what the aliasing test guards against."""
    g = Graph()
    vals = [g.add_value(TensorValue(torch.float32, s, s)) for s in [(5, 7)] * 5 + [(7, 5)]]
    x, a, b, c, d, e = vals
    g.inputs = [x]
    g.nodes = [Node("relu", [x], [a]), Node("exp", [a], [b]), Node("neg", [b], [c]),
               Node("mul", [c, c], [d], {"other": None}),
               Node("view", [d], [e], {"sizes": [7, 5]})]
    g.outputs = [a, e]
    return g


def chain_reference(x):
    a = torch.relu(x)
    c = -torch.exp(a)
    return a, (c * c).reshape(7, 5)


def test_graph_outputs_never_share_a_buffer_a_later_dispatch_writes():
    g = chain_graph()
    ex = WebGpuExecutor(g, {})
    try:
        dispatches = ex.dispatch_list()
        for vid, slot in ex.output_slots():
            made = max(i for i, d in enumerate(dispatches) if vid in d[4])
            later = [d[0] for d in dispatches[made + 1:] if slot in d[3]]
            assert later == [], f"output {vid}'s buffer is overwritten later by {later}"
        x = torch.randn(5, 7)
        for got, want in zip(ex.execute([x]), chain_reference(x.double())):
            torch.testing.assert_close(got, want.float(), **tol("transcendental", "webgpu"))
    finally:
        ex.destroy()


def test_values_with_overlapping_lives_get_distinct_buffers():
    g = chain_graph()
    ex = WebGpuExecutor(g, {})
    try:
        lives, slot_of = ex._lives, {v: ex._slot_of(v) for v in ex._lives}
        for u in lives:
            for v in lives:
                if u < v and lives[u].overlaps(lives[v]):
                    assert slot_of[u] != slot_of[v], f"values {u} and {v} share a buffer"
        assert ex.describe()["buffers"] < len(g.values)   # and buffers are reused
    finally:
        ex.destroy()


def test_dispatches_follow_node_order_and_read_only_what_was_written():
    g = chain_graph()
    ex = WebGpuExecutor(g, {})
    try:
        dispatches = ex.dispatch_list()
        assert [op for op, *_ in dispatches] == ["relu", "exp", "neg", "mul"]  # view: metadata
        written = {ex._slot_of(v) for v in g.inputs}
        for op, _, reads, writes, _ in dispatches:
            assert set(reads) <= written, f"{op} reads a buffer nothing wrote yet"
            written |= set(writes)
    finally:
        ex.destroy()


def dynamic_block():
    graph, weights = block_graph(dim=32, hidden=64, max_seq=16)
    return graph, weights


def block_reference(weights, x):
    w = {k: v.double() for k, v in weights.items()}
    h = torch.nn.functional.rms_norm(x, [32], w["norm"], 1e-6)
    up = torch.nn.functional.silu(h @ w["w_up"].T + w["b_up"])
    return torch.softmax(up @ w["w_down"].T, -1)


@pytest.mark.parametrize("pieces", [False, True])
@pytest.mark.parametrize("ahead", [False, True])
def test_encoding_ahead_submits_the_next_execute_of_a_binding_bit_for_bit(monkeypatch, ahead,
                                                                          pieces):
    """With encode_ahead, an execute of the binding encoded ahead submits those encoders: the
    same bits as encoding them then, on new inputs each time; another binding between encodes
    its own; a binding run twice in a row holds finished command buffers, still valid after
    another binding's executes; and destroy frees everything the encoders and the command
    buffers held (wgpu-native leaks a finished command buffer dropped unsubmitted)."""
    if pieces:   # the block's dispatches in submits of one or two, encoded ahead alike
        monkeypatch.setattr(webgpu_executor, "SPLIT_SUBMIT_MIN", 2)
        monkeypatch.setattr(webgpu_executor, "SUBMIT_EVERY", 2)
    graph, weights = dynamic_block()
    settle()
    before = live_wgpu_objects()["native"]
    ex, plain = WebGpuExecutor(graph, weights), WebGpuExecutor(graph, weights)
    if pieces:
        binding = ex.plan.binding_for([torch.randn(3, 32)])
        assert len(webgpu_executor._pieces(binding.payload.dispatches)) > 2
        del binding   # it holds bind groups
    ex.encode_ahead, plain.encode_ahead = ahead, False
    try:
        seqs = (3, 3, 3, 16, 3, 16, 16, 1)
        for seq in seqs:
            x = torch.randn(seq, 32)
            got, = ex.execute([x])
            assert torch.equal(got, plain.execute([x])[0])
            torch.testing.assert_close(got, block_reference(weights, x.double()).float(),
                                       **tol("model", "webgpu"))
        # encoded ahead: a binding right after itself (twice at 3, once at 16) and 3 after 16,
        # whose command buffers were finished ahead and held since 3 ran twice in a row
        assert ex.ahead_submits == (4 if ahead else 0) and plain.ahead_submits == 0
        assert ex.finished_submits == (2 if ahead else 0)
        assert len(ex._held) == (1 if ahead else 0)   # 16's, submitted by destroy
        # held: the first piece and the rest, whatever SUBMIT_EVERY cut for encoding as it goes
        assert [len(cbs) for _, cbs in ex._held] == ([2 if pieces else 1] if ahead else [])
    finally:
        ex.destroy()
        plain.destroy()
    del ex, plain
    settle()
    after = live_wgpu_objects()["native"]
    assert (after["Buffer"], after["BindGroup"], after["CommandBuffer"]) == \
        (before["Buffer"], before["BindGroup"], before["CommandBuffer"])


def test_a_binding_built_again_after_eviction_takes_its_held_command_buffers(monkeypatch):
    from delegate.runtime import graph_plan

    monkeypatch.setattr(graph_plan, "CACHE_SIZE", 1)
    graph, weights = dynamic_block()
    ex = WebGpuExecutor(graph, weights)
    try:
        for seq in (3, 3, 5, 3):   # 3's buffers held after its second execute; 5 evicts 3
            x = torch.randn(seq, 32)
            torch.testing.assert_close(ex.execute([x])[0],
                                       block_reference(weights, x.double()).float(),
                                       **tol("model", "webgpu"))
        assert ex.plan.stats.misses == 3 and ex.finished_submits == 1
    finally:
        ex.destroy()


def test_dynamic_shapes_rewrite_params_per_execute():
    graph, weights = dynamic_block()
    ex = WebGpuExecutor(graph, weights)
    try:
        for seq in (3, 16, 1, 7):
            x = torch.randn(seq, 32)
            got, = ex.execute([x])
            assert got.shape == (seq, 32)
            torch.testing.assert_close(got, block_reference(weights, x.double()).float(),
                                       **tol("model", "webgpu"))
    finally:
        ex.destroy()


def test_raw_pass_calls_encode_what_the_checked_calls_encode(monkeypatch):
    # RawPassCalls skip wgpu-py's per-call error capture; the results must not change
    graph, weights = dynamic_block()
    xs = [torch.randn(seq, 32) for seq in (3, 16, 1)]
    results = {}
    for checked in ("0", "1"):
        monkeypatch.setenv("ETWGPU_CHECKED_ENCODE", checked)
        ex = WebGpuExecutor(graph, weights)
        try:
            assert (ex._raw is None) == (checked == "1")
            results[checked] = [ex.execute([x])[0] for x in xs]
        finally:
            ex.destroy()
    for raw, checked in zip(results["0"], results["1"]):
        assert torch.equal(raw, checked)


def test_native_map_reads_what_wgpu_pys_map_sync_reads(monkeypatch):
    # NativeMap polls in this thread instead of waiting on wgpu-py's poll thread; it blocks at
    # once (spin 0), after a spin that outlasts the work, or after one too short for it
    graph, weights = dynamic_block()
    xs = [torch.randn(seq, 32) for seq in (3, 16, 1)]
    gpu = wgsl_device.get_device()
    native = gpu._native_map
    assert native is not None   # wgpu-py's native backend, as CI installs it
    results = {}
    for way, spin_s in (("native", 0.0), ("spin", 0.5), ("short spin", 1e-9), ("map_sync", 0.0)):
        monkeypatch.setattr(native, "spin_s", spin_s)
        if way == "map_sync":
            monkeypatch.setattr(gpu, "_native_map", None)
        ex = WebGpuExecutor(graph, weights)
        try:
            results[way] = [ex.execute([x])[0] for x in xs]
        finally:
            ex.destroy()
    for way in ("native", "spin", "short spin"):
        for got, synced in zip(results[way], results["map_sync"]):
            assert torch.equal(got, synced), way


def test_readbacks_spin_on_a_gpu_and_block_at_once_on_a_software_adapter(monkeypatch):
    monkeypatch.delenv("ETWGPU_MAP_SPIN_US", raising=False)
    assert wgsl_device.map_spin_s(software=True) == 0.0
    assert wgsl_device.map_spin_s(software=False) == wgsl_device.MAP_SPIN_US * 1e-6
    monkeypatch.setenv("ETWGPU_MAP_SPIN_US", "250")
    assert wgsl_device.map_spin_s(software=True) == wgsl_device.map_spin_s(False) == 250e-6
    gpu = wgsl_device.get_device()
    expected = 0.0 if gpu.software else wgsl_device.MAP_SPIN_US * 1e-6   # CI: lavapipe, 0
    assert gpu._native_map.spin_s == expected


def test_a_refused_native_map_raises_device_error_and_leaves_the_buffer_usable():
    import numpy as np
    import wgpu

    gpu = wgsl_device.get_device()
    usage = wgpu.BufferUsage
    src = gpu.device.create_buffer(size=64, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST)
    dst = gpu.device.create_buffer(size=64, usage=usage.MAP_READ | usage.COPY_DST)
    try:
        gpu.queue.write_buffer(src, 0, np.arange(16, dtype=np.float32))
        encoder = gpu.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(src, 0, dst, 0, 64)
        gpu.queue.submit([encoder.finish()])
        with pytest.raises(DeviceError, match="readback of 128 bytes: expected the buffer mapped"):
            gpu.map_read(dst, 128)   # past the buffer's end
        with pytest.raises(DeviceError, match="expected the buffer mapped"):
            gpu.map_read(src, 64)    # not MAP_READ
        got = np.frombuffer(gpu.map_read(dst, 64), np.float32).copy()
        gpu.unmap_read(dst)
        assert got.tolist() == list(range(16))
    finally:
        src.destroy()
        dst.destroy()


def test_an_invalid_raw_dispatch_still_raises_when_the_encoder_finishes():
    import wgpu

    graph, weights = dynamic_block()
    ex = WebGpuExecutor(graph, weights)
    try:
        assert ex._raw is not None   # wgpu-py's native backend, as CI installs it
        b = ex.plan.binding_for([torch.randn(3, 32)])
        d, _ = b.payload.dispatches[0]
        encoder = ex._gpu.device.create_command_encoder()
        ex._encode(encoder.begin_compute_pass(), [(d, (1 << 20, 1))])   # > 65,535 groups
        with pytest.raises(wgpu.GPUValidationError, match="65535"):
            encoder.finish()
    finally:
        ex.destroy()


def test_input_above_its_upper_bound_raises_input_error():
    graph, weights = dynamic_block()
    ex = WebGpuExecutor(graph, weights)
    try:
        with pytest.raises(InputError, match="at most 16"):
            ex.execute([torch.randn(17, 32)])
    finally:
        ex.destroy()


def test_grid_above_65535_workgroups_folds_to_2d():
    x = torch.randn(70001, 2)   # one workgroup per softmax row: 70,001 > 65,535
    graph, weights, feed = single_op_graph("softmax", [x], {"dim": 1})
    ex = WebGpuExecutor(graph, weights)
    try:
        assert ex._fold(70001) == (35001, 2)
        got, = ex.execute(feed)
        torch.testing.assert_close(got, torch.softmax(x.double(), 1).float(),
                                   **tol("softmax", "webgpu"))
    finally:
        ex.destroy()


def test_destroy_frees_every_buffer_and_bind_group():
    graph, weights = dynamic_block()
    settle()
    before = live_wgpu_objects()["native"]
    ex = WebGpuExecutor(graph, weights)
    ex.execute([torch.randn(4, 32)])
    during = live_wgpu_objects()["native"]
    assert during["Buffer"] > before["Buffer"] and during["BindGroup"] > before["BindGroup"]
    ex.destroy()
    del ex
    settle()
    after = live_wgpu_objects()["native"]
    assert (after["Buffer"], after["BindGroup"]) == (before["Buffer"], before["BindGroup"])


def test_fifty_load_destroy_cycles_do_not_grow_memory_or_wgpu_objects():
    grew_mb, before, after = run(cycles=50, every=50, out=open("/dev/null", "w"))
    assert before == after, "live wgpu objects changed across load/destroy cycles"
    assert grew_mb < 8.0, f"process RSS grew {grew_mb:.1f} MB over 50 cycles"


def test_pipelines_are_shared_across_loads_and_released_by_destroy():
    gpu = wgsl_device.get_device()
    graph, weights = dynamic_block()
    first = WebGpuExecutor(graph, weights)
    count = gpu.pipeline_count()
    second = WebGpuExecutor(graph, weights)
    assert gpu.pipeline_count() == count            # fetched from the cache, not rebuilt
    users = {k: gpu._pipelines[k].users for k in first._pipeline_keys}
    first.destroy()
    second.destroy()
    assert all(k not in gpu._pipelines for k in users)   # no executor holds them any more
    assert len(gpu._idle) <= wgsl_device.IDLE_PIPELINES


def test_no_matching_adapter_raises_device_error(monkeypatch):
    monkeypatch.setenv(wgsl_device.ADAPTER_ENV, "no-such-gpu-anywhere")
    graph, weights = dynamic_block()
    with pytest.raises(DeviceError, match="no-such-gpu-anywhere"):
        WebGpuExecutor(graph, weights)
    import kernels_wgsl

    assert "no-such-gpu-anywhere" in kernels_wgsl.adapter_unavailable()


def test_device_auto_falls_back_to_cpu_and_webgpu_refuses(monkeypatch, caplog):
    from delegate.runtime.wgpu_backend import choose_device

    monkeypatch.setenv(wgsl_device.ADAPTER_ENV, "no-such-gpu-anywhere")
    graph, _ = dynamic_block()
    with caplog.at_level(logging.INFO, logger="etwgpu"):
        assert choose_device("auto", graph) == "cpu"
    assert "no-such-gpu-anywhere" in caplog.text
    with pytest.raises(DeviceError):
        choose_device("webgpu", graph)


def test_adapter_picked_by_backend_name_is_logged(monkeypatch, caplog):
    backend = wgsl_device.get_device().adapter.info["backend_type"]
    monkeypatch.setenv(wgsl_device.ADAPTER_ENV, backend.upper())   # case-insensitive
    wgsl_device._DEVICES.pop(backend.upper(), None)
    with caplog.at_level(logging.INFO, logger="etwgpu"):
        gpu = wgsl_device.get_device()
    assert gpu.adapter.info["backend_type"] == backend
    assert "webgpu adapter" in caplog.text and backend in caplog.text
    wgsl_device._DEVICES.pop(backend.upper(), None)


def test_invalid_shader_raises_shader_error_with_the_driver_message():
    gpu = wgsl_device.get_device()
    bad = ("@group(0) @binding(0) var<uniform> p: vec4<u32>;\n"
           "@compute @workgroup_size(1) fn main() { let x: u32 = undefined_thing; }")
    with pytest.raises(ShaderError, match="undefined_thing") as err:
        gpu.acquire_pipeline(bad, "main", (), ("uniform",))
    assert isinstance(err.value, DelegateError)


def test_outputs_keep_integer_and_shape_dtypes_through_the_round_trip():
    g = Graph()
    w = g.add_value(TensorValue(torch.float32, (11, 3), (11, 3), "table"))
    idx = g.add_value(TensorValue(torch.int64, (SymExpr("s0"),), (9,)))
    out = g.add_value(TensorValue(torch.float32, (SymExpr("s0"), 3), (9, 3)))
    g.inputs, g.outputs = [idx], [out, idx]
    g.symbols = [SymbolBinding("s0", 0, 0)]
    g.nodes = [Node("embedding", [w, idx], [out])]
    table = torch.randn(11, 3)
    ex = WebGpuExecutor(g, {"table": table})
    try:
        ids = torch.tensor([10, 0, 4, 4])
        rows, echoed = ex.execute([ids])
        assert torch.equal(rows, table[ids]) and echoed.dtype == torch.int64
        assert torch.equal(echoed, ids)
    finally:
        ex.destroy()


@pytest.mark.parametrize("timestamps", [True, False])
def test_profiled_execute_times_every_dispatch_in_order(timestamps, monkeypatch):
    graph, weights = dynamic_block()
    ex = WebGpuExecutor(graph, weights)
    try:
        if not timestamps:
            monkeypatch.setattr(ex._gpu, "has_timestamps", False)
        elif not ex._gpu.has_timestamps:
            pytest.fail("lavapipe offers timestamp-query; this adapter does not")
        x = torch.randn(6, 32)
        outs, times, clock = ex.execute_profiled([x])
        assert clock == ("gpu" if timestamps else "wall")
        assert [label for label, _ in times] == [
            "rms_norm [rms_norm]", "steel_gemm [linear]", "unary [silu]",
            "steel_gemm [linear]", "softmax [softmax]"]
        assert all(sec >= 0 for _, sec in times)
        torch.testing.assert_close(outs[0], block_reference(weights, x.double()).float(),
                                   **tol("model", "webgpu"))
    finally:
        ex.destroy()


def test_profiled_execute_whole_times_one_pass_of_every_dispatch():
    graph, weights = dynamic_block()
    ex = WebGpuExecutor(graph, weights)
    try:
        x = torch.randn(6, 32)
        outs, times, clock = ex.execute_profiled([x], mode="whole")
        assert clock == "gpu" and [label for label, _ in times] == ["whole pass [5 dispatches]"]
        assert times[0][1] > 0
        torch.testing.assert_close(outs[0], block_reference(weights, x.double()).float(),
                                   **tol("model", "webgpu"))
    finally:
        ex.destroy()


# "marginal": what each dispatch adds to the pass of those before it (labels "+");
# "dropped": what leaving each out saves from the whole pass (labels "-"). Both replay
# dispatches and must still return the whole pass's outputs.
@pytest.mark.parametrize("mode, sign", [("marginal", "+"), ("dropped", "-")])
def test_profiled_execute_replaying_modes_label_each_dispatch_and_return_its_outputs(mode, sign):
    graph, weights = dynamic_block()
    ex = WebGpuExecutor(graph, weights)
    try:
        x = torch.randn(6, 32)
        _, each, _ = ex.execute_profiled([x])
        outs, rows, clock = ex.execute_profiled([x], mode=mode)
        assert clock == "gpu" and [lab for lab, _ in rows] == [f"{sign}{lab}" for lab, _ in each]
        torch.testing.assert_close(outs[0], block_reference(weights, x.double()).float(),
                                   **tol("model", "webgpu"))
        with pytest.raises(InputError, match="execute_profiled mode: expected one of"):
            ex.execute_profiled([x], mode="sum")
    finally:
        ex.destroy()


@pytest.mark.parametrize("mode", ["marginal", "dropped"])
def test_profiled_execute_replaying_modes_refuse_a_program_with_state(mode):
    # replaying a stateful program's dispatches would apply its updates several times
    from tests.test_resident_state import _cache_program

    _, prog = _cache_program("webgpu")
    try:
        (_, ex), = prog.load_method("forward").delegates
        with pytest.raises(InputError, match=f"'{mode}' replays dispatches: expected a program "
                                             "without state, got 1 state updates"):
            ex.execute_profiled([torch.randn(1, 3, 5), torch.tensor([0])], mode=mode)
    finally:
        prog.destroy()


def test_profile_method_prints_dispatches_grouped_by_kernel(tmp_path):
    from delegate.aot import lower
    from delegate.models import MLP, seeded
    from delegate.runtime.profile import profile_method

    model = seeded(MLP(13, 29, 7))
    path = tmp_path / "mlp.pte"
    path.write_bytes(lower(model, (torch.randn(5, 13),), device="webgpu").buffer)
    report = profile_method(str(path), device="webgpu", runs=2)
    assert "GPU timestamps" in report and "steel_gemm [linear]" in report
    assert "total per run" in report


def test_adapter_load_option_overrides_the_environment(monkeypatch):
    monkeypatch.setenv(wgsl_device.ADAPTER_ENV, "no-such-gpu-anywhere")
    backend = wgsl_device.get_device("").adapter.info["backend_type"]
    graph, weights = dynamic_block()
    ex = WebGpuExecutor(graph, weights, adapter=backend)
    try:
        assert ex.describe()["adapter"].endswith(f"[{backend}, " + ex._gpu.adapter.info["adapter_type"] + "]")
    finally:
        ex.destroy()
        wgsl_device._DEVICES.pop(backend, None)


def test_linear_routes_by_live_rows_gemv_for_one_gemm_for_more():
    graph, weights = dynamic_block()
    ex = WebGpuExecutor(graph, weights)
    try:
        for seq, kernel in ((1, "coop_gemv"), (9, "steel_gemm")):
            x = torch.randn(seq, 32)
            outs, times, _ = ex.execute_profiled([x])
            assert [label for label, _ in times if "[linear]" in label] == [f"{kernel} [linear]"] * 2
            torch.testing.assert_close(outs[0], block_reference(weights, x.double()).float(),
                                       **tol("model", "webgpu"))
    finally:
        ex.destroy()


def test_zero_dim_weights_and_inputs_upload():
    x, s = torch.randn(()), torch.tensor(2.5)
    graph, weights, feed = single_op_graph("mul", [x, s], {"other": None}, consts={1})
    ex = WebGpuExecutor(graph, weights)
    try:
        got, = ex.execute(feed)
        assert got.shape == () and torch.equal(got, x * s)
    finally:
        ex.destroy()


class _AddInt64(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.register_buffer("c", torch.tensor(c, dtype=torch.int64))

    def forward(self, ids):
        return ids + self.c


def test_int64_past_int32_is_refused_not_wrapped():
    """The GPU holds int64 as int32: an input value past its range is an InputError at
    execute (the state and later executes unharmed), a weight past it an error at load."""
    from delegate.aot import lower
    from delegate.errors import UnsupportedError
    from delegate.runtime.program import Runtime

    ids = torch.tensor([[3, 5, 7]])
    prog = Runtime.get().load_program(lower(_AddInt64([1, 2, 3]), (ids,), device="webgpu").buffer,
                                      device="webgpu")
    try:
        method = prog.load_method("forward")
        with pytest.raises(InputError, match="int32's range"):
            method.execute([torch.tensor([[1, 2 ** 40, 3]])])
        (got,), = [method.execute([ids])]
        assert torch.equal(got, ids + torch.tensor([1, 2, 3]))
    finally:
        prog.destroy()
    big = lower(_AddInt64([1, -2 ** 33, 3]), (ids,), device="webgpu").buffer
    with pytest.raises((UnsupportedError, DelegateError), match="int32's range"):
        Runtime.get().load_program(big, device="webgpu").load_method("forward")

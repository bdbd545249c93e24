"""Per-op CPU fallback inside a WebGPU load: nodes whose op has no WGSL kernel run on the CPU
kernels, with buffers moving only at the segment edges, and the whole graph matches eager."""
import logging

import pytest
import torch

import kernels_wgsl
from delegate.aot import lower
from delegate.ir import Graph, Node, SymExpr, SymbolBinding, TensorValue
from delegate.runtime.program import Runtime
from delegate.runtime.webgpu_executor import WebGpuExecutor


@pytest.fixture
def without_wgsl(monkeypatch):
    """Drop the WGSL kernels of some ops for one test, as if they had none."""
    def drop(*names):
        kernels_wgsl._load()
        for n in names:
            monkeypatch.delitem(kernels_wgsl._KERNELS, n)
    return drop


def chain_graph() -> Graph:
    """x -> exp -> neg -> add(., x) -> sigmoid, x [s0, 5]: the middle ops go to the CPU."""
    g, s0 = Graph(), SymExpr("s0")

    def act():
        return g.add_value(TensorValue(torch.float32, (s0, 5), (9, 5)))
    x, a, b, c, y = act(), act(), act(), act(), act()
    w = g.add_value(TensorValue(torch.float32, (5,), (5,), "w"))
    g.inputs, g.outputs, g.symbols = [x], [y, b], [SymbolBinding("s0", 0, 0)]
    g.nodes = [Node("exp", [x], [a]), Node("neg", [a], [b]),
               Node("add", [b, w], [c], {"other": None, "alpha": 1.0}), Node("sigmoid", [c], [y])]
    return g


def test_nodes_without_a_wgsl_kernel_run_on_the_cpu_inside_the_webgpu_load(without_wgsl):
    without_wgsl("neg", "add")
    w = torch.randn(5)
    ex = WebGpuExecutor(chain_graph(), {"w": w})
    try:
        for rows in (3, 7, 3):
            x = torch.randn(rows, 5)
            y, b = ex.execute([x])
            torch.testing.assert_close(b, -x.exp(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(y, torch.sigmoid(-x.exp() + w), rtol=1e-5, atol=1e-5)
        parts = ex.plan.binding_for([torch.randn(3, 5)]).payload.parts
        assert [type(p).__name__ for p in parts] == ["list", "CpuRun", "list"]
        assert len(parts[1].reads) == 1            # only exp's result comes back
        _, times, clock = ex.execute_profiled([torch.randn(3, 5)])
        assert any(label.startswith("cpu fallback [add, neg]") for label, _ in times)
    finally:
        ex.destroy()


def test_a_cpu_lowered_blob_with_cpu_only_ops_runs_on_webgpu_and_says_so(without_wgsl, caplog):
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Hardswish(), torch.nn.Linear(8, 4))
    x = torch.randn(3, 6)
    pte = lower(model.eval(), (x,), device="cpu").buffer
    without_wgsl("hardswish")
    prog = Runtime.get().load_program(pte, device="webgpu")
    try:
        with caplog.at_level(logging.INFO, logger="etwgpu"):
            method = prog.load_method("forward")
        (_, ex), = method.delegates
        assert ex.device == "webgpu"
        out = method.execute([x])[0]
        with torch.no_grad():
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    finally:
        prog.destroy()
    assert "runs ['hardswish'] on the CPU kernels" in caplog.text

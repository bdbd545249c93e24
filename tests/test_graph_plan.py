"""The graph plan both executors replay: one binding per shape-symbol binding, built and
validated once, then replayed; outputs handed back are never written by a later execute."""
import pytest
import torch

import kernels_cpu
from delegate.errors import BlobError, DelegateError, KernelError
from delegate.ir import Graph, Node, ScalarValue, SymbolBinding, SymExpr, TensorValue
from delegate.runtime.cpu_executor import CpuExecutor

EXECUTORS = ["cpu", "webgpu"]


def executor(kind: str, graph: Graph, weights=None):
    if kind == "cpu":
        return CpuExecutor(graph, weights or {})
    from delegate.runtime.webgpu_executor import WebGpuExecutor

    return WebGpuExecutor(graph, weights or {})


def neg_graph(out_dims=None, bound: int = 8) -> Graph:
    """y = -x with x [s0, 4] (s0 <= bound); out_dims overrides what export recorded for y."""
    g = Graph()
    s0 = SymExpr("s0")
    x = g.add_value(TensorValue(torch.float32, (s0, 4), (bound, 4)))
    dims = out_dims or (s0, 4)
    y = g.add_value(TensorValue(torch.float32, dims, tuple(bound if isinstance(d, str) else d
                                                           for d in dims)))
    g.inputs, g.outputs, g.symbols = [x], [y], [SymbolBinding("s0", 0, 0)]
    g.nodes = [Node("neg", [x], [y], {}, name="my_neg")]
    return g


@pytest.mark.parametrize("kind", EXECUTORS)
def test_plan_cache_hits_a_seen_binding_and_misses_a_new_one(kind):
    ex = executor(kind, neg_graph())
    try:
        for n in (3, 3, 5, 3, 5):
            x = torch.randn(n, 4)
            torch.testing.assert_close(ex.execute([x])[0], -x)
        assert (ex.plan.stats.misses, ex.plan.stats.hits) == (2, 3)
        assert ex.describe()["plans"]["misses"] == 2
    finally:
        ex.destroy()


def test_plan_cache_evicts_the_least_recently_used_binding(monkeypatch):
    # a decode step's binding, used between prompts of new lengths, outlives them
    from delegate.runtime import graph_plan

    monkeypatch.setattr(graph_plan, "CACHE_SIZE", 3)
    ex = executor("cpu", neg_graph(bound=16))
    try:
        for n in (1, 2, 1, 3, 1, 4, 1, 5, 1):
            x = torch.randn(n, 4)
            torch.testing.assert_close(ex.execute([x])[0], -x)
        assert (ex.plan.stats.misses, ex.plan.stats.hits) == (5, 4)   # 1 built once
        ex.execute([torch.randn(2, 4)])   # evicted by 4 and 5: built again
        assert ex.plan.stats.misses == 6
    finally:
        ex.destroy()


@pytest.mark.parametrize("kind", EXECUTORS)
def test_shape_inference_disagreeing_with_export_is_a_blob_error_naming_the_node(kind):
    ex = executor(kind, neg_graph(out_dims=(SymExpr("s0"), 5)))
    try:
        with pytest.raises(BlobError, match=r"node 0 \(neg from 'my_neg'\).*\(3, 5\).*\(3, 4\)"):
            ex.execute([torch.randn(3, 4)])
    finally:
        ex.destroy()


def test_validation_pass_catches_a_kernel_leaving_another_shape(monkeypatch):
    monkeypatch.setenv("ETWGPU_VALIDATE", "1")
    ex = CpuExecutor(neg_graph(), {})

    def bad_neg(ins, outs, attrs, scratch):
        outs[0].resize_(1, 4)
    ex._kernels[0] = kernels_cpu.CpuKernel("neg", bad_neg)
    with pytest.raises(BlobError, match=r"node 0 \(neg from 'my_neg'\): kernel output shapes"):
        ex.execute([torch.randn(3, 4)])
    assert ex.plan.stats.validations >= 1


def test_validation_runs_on_every_execute_only_when_asked(monkeypatch):
    quiet = CpuExecutor(neg_graph(), {})
    for _ in range(3):
        quiet.execute([torch.randn(2, 4)])
    assert quiet.plan.stats.validations == 1
    monkeypatch.setenv("ETWGPU_VALIDATE", "1")
    loud = CpuExecutor(neg_graph(), {})
    for _ in range(3):
        loud.execute([torch.randn(2, 4)])
    assert loud.plan.stats.validations == 3


def test_a_raising_kernel_names_its_node():
    ex = CpuExecutor(neg_graph(), {})

    def broken(ins, outs, attrs, scratch):
        raise RuntimeError("boom")
    ex._kernels[0] = kernels_cpu.CpuKernel("neg", broken)
    with pytest.raises(KernelError, match=r"node 0 \(neg from 'my_neg'\).*RuntimeError: boom"):
        ex.execute([torch.randn(3, 4)])


@pytest.mark.parametrize("kind", EXECUTORS)
def test_symbol_bound_by_a_scalar_input(kind):
    """SymbolBinding(s0, input, -1), as lowering emits for a SymInt delegate input."""
    g = Graph()
    s0 = SymExpr("s0")
    n = g.add_value(ScalarValue("int"))
    x = g.add_value(TensorValue(torch.float32, (s0, 4), (8, 4)))
    y = g.add_value(TensorValue(torch.float32, (s0, 4), (8, 4)))
    g.inputs, g.outputs, g.symbols = [n, x], [y], [SymbolBinding("s0", 0, -1)]
    g.nodes = [Node("neg", [x], [y], {})]
    ex = executor(kind, g)
    try:
        for rows in (3, 6):
            x_in = torch.randn(rows, 4)
            torch.testing.assert_close(ex.execute([rows, x_in])[0], -x_in)
    finally:
        ex.destroy()


@pytest.mark.parametrize("kind", EXECUTORS)
def test_outputs_written_into_given_tensors_and_never_overwritten_later(kind):
    ex = executor(kind, neg_graph())
    try:
        x1, x2 = torch.randn(3, 4), torch.randn(5, 4)
        first = ex.execute([x1])[0]
        mine = torch.empty(8, 4)[:0]   # the caller's tensor, resized to the live shape
        given = ex.execute([x2], [mine])[0]
        assert given is mine and mine.shape == (5, 4)
        torch.testing.assert_close(mine, -x2)
        ex.execute([torch.randn(3, 4)])
        torch.testing.assert_close(first, -x1)
    finally:
        ex.destroy()


@pytest.mark.parametrize("device", EXECUTORS)
def test_runner_outputs_are_not_overwritten_by_the_next_execute(device):
    from delegate.aot import lower
    from delegate.models import MLP, seeded
    from delegate.runtime.program import Runtime

    model = seeded(MLP(13, 29, 7))
    batch = torch.export.Dim("batch", min=1, max=16)
    pte = lower(model, (torch.randn(5, 13),), dynamic_shapes=({0: batch},), device=device).buffer
    prog = Runtime.get().load_program(pte, device=device)
    try:
        m = prog.load_method("forward")
        x1, x2 = torch.randn(5, 13), torch.randn(9, 13)
        y1 = m.execute([x1])[0]
        y2 = m.execute([x2])[0]
        m.execute([torch.randn(5, 13)])
        with torch.no_grad():
            torch.testing.assert_close(y1, model(x1), rtol=1e-3, atol=1e-3)
            torch.testing.assert_close(y2, model(x2), rtol=1e-3, atol=1e-3)
    finally:
        prog.destroy()


@pytest.mark.parametrize("kind", EXECUTORS)
def test_offset_symbols_key_no_plan(kind):
    """A symbol that only an attribute reads moves data, not shapes: one binding serves all,
    its params patched per execute."""
    g = Graph()
    pos = g.add_value(ScalarValue("int"))
    x = g.add_value(TensorValue(torch.float32, (8, 4), (8, 4)))
    y = g.add_value(TensorValue(torch.float32, (2, 4), (2, 4)))
    g.inputs, g.outputs, g.symbols = [pos, x], [y], [SymbolBinding("p0", 0, -1)]
    g.nodes = [Node("slice", [x], [y], {"dim": 0, "start": SymExpr("p0"),
                                        "end": SymExpr("p0 + 2"), "step": 1})]
    ex = executor(kind, g)
    try:
        x_in = torch.randn(8, 4)
        for p in (0, 3, 6, 3):
            torch.testing.assert_close(ex.execute([p, x_in])[0], x_in[p:p + 2])
        assert (ex.plan.stats.misses, ex.plan.stats.hits) == (1, 3)
    finally:
        ex.destroy()


def test_a_wrong_input_after_a_cached_binding_is_still_an_input_error():
    from delegate.errors import InputError

    ex = CpuExecutor(neg_graph(), {})
    ex.execute([torch.randn(3, 4)])
    with pytest.raises(InputError):
        ex.execute([torch.randn(3, 4, dtype=torch.float64)])
    with pytest.raises(InputError):
        ex.execute([torch.randn(3, 5)])
    with pytest.raises(InputError):
        ex.execute([])
    assert isinstance(InputError("x"), DelegateError)


@pytest.mark.parametrize("device", EXECUTORS)
def test_runner_neither_copies_an_input_read_in_place_nor_clones_a_delegate_output(device):
    """The caller's contiguous input feeds the delegate as it is and is not held after the
    execute; the delegate writes a fresh tensor that is returned without a clone."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    from delegate.aot import lower
    from delegate.models import MLP, seeded
    from delegate.runtime.program import Runtime

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    model = seeded(MLP(13, 29, 7))
    pte = lower(model, (torch.randn(5, 13),), device=device).buffer
    prog = Runtime.get().load_program(pte, device=device)
    try:
        m = prog.load_method("forward")
        x = torch.randn(5, 13)
        m.execute([x])
        with Log() as log:
            y = m.execute([x])[0]
        copies = [op for op in log.ops if "copy_" in op or "clone" in op]
        assert copies == [], log.ops
        with torch.no_grad():
            torch.testing.assert_close(y, model(x), rtol=1e-3, atol=1e-3)
        probe = torch.randn(5, 13)
        gone = weakref.ref(probe)
        m.execute([probe])
        del probe
        assert gone() is None   # the runner let go of the caller's tensor
        strided = torch.randn(13, 5).t()   # not contiguous: copied into the planned slot
        with torch.no_grad():
            torch.testing.assert_close(m.execute([strided])[0], model(strided),
                                       rtol=1e-3, atol=1e-3)
    finally:
        prog.destroy()

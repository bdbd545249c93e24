"""Delegate-owned state: mutated buffers (tag_mutated_buffer) live in the delegate, a cache
write at a host-known position (`slice_scatter`, in place where nothing reads the old value),
position symbols bound from an input's value, and the export's runtime checks on them."""
import pytest
import torch

from delegate import blob
from delegate.aot import lower, undelegated_ops
from delegate.errors import BlobError, InputError
from delegate.ir import Graph, Node, StateUpdate, SymbolBinding, SymExpr, TensorValue
from delegate.runtime.program import Runtime
from tests.test_graph_plan import EXECUTORS, executor
from tests.tolerances import tol


class Cache(torch.nn.Module):
    """cache[:, pos:pos + T] = x (ExecuTorch's KV cache write); returns cache * 2."""

    def __init__(self, rows: int = 11, width: int = 5):
        super().__init__()
        self.register_buffer("cache", torch.arange(rows * width, dtype=torch.float32)
                             .reshape(1, rows, width) / 7)

    def forward(self, x, input_pos):
        pos = input_pos[-1].item()
        torch._check(pos >= 0)
        torch._check(pos + x.shape[1] <= self.cache.shape[1])
        self.cache[:, torch.arange(x.shape[1]) + pos] = x
        return self.cache * 2


def _cache_program(device: str):
    model = Cache()
    t = torch.export.Dim("T", min=1, max=7)
    pm = lower(model, (torch.randn(1, 3, 5), torch.tensor([0])),
               dynamic_shapes=({1: t}, None), device=device)
    return pm, Runtime.get().load_program(pm.buffer, device=device)


@pytest.mark.parametrize("device", EXECUTORS)
def test_a_mutated_buffer_lives_in_the_delegate_and_carries_across_executes(device):
    pm, prog = _cache_program(device)
    try:
        assert undelegated_ops(pm) == []
        m = prog.load_method("forward")
        eager = Cache()
        for pos, t in ((0, 3), (3, 1), (4, 7), (2, 2)):
            x, at = torch.randn(1, t, 5), torch.tensor([pos])
            want = eager(x, at)
            torch.testing.assert_close(m.execute([x, at])[0], want, **tol("shape", device))
        (backend, handle), = m.delegates
        assert backend.describe(handle)["state_bytes"] == 11 * 5 * 4
    finally:
        prog.destroy()


@pytest.mark.parametrize("device", EXECUTORS)
def test_a_write_past_the_cache_is_a_typed_error_and_the_state_is_kept(device):
    pm, prog = _cache_program(device)
    try:
        m = prog.load_method("forward")
        eager = Cache()
        x = torch.randn(1, 3, 5)
        m.execute([x, torch.tensor([0])])
        eager(x, torch.tensor([0]))
        for bad in (9, -1, 11):   # 9 + 3 > 11 rows; negative; past the end
            with pytest.raises(InputError, match="expected .*>= 0|slice_scatter rows"):
                m.execute([torch.randn(1, 3, 5), torch.tensor([bad])])
        y = torch.randn(1, 1, 5)   # the failed executes wrote nothing
        torch.testing.assert_close(m.execute([y, torch.tensor([3])])[0],
                                   eager(y, torch.tensor([3])))
    finally:
        prog.destroy()


def _scatter_graph(in_place: bool) -> Graph:
    """out = slice_scatter(dst, src, dim 1, start=pos); dst = -x (a node output) so the
    in-place twin may write it; `pos` is element 0 of an int input."""
    g = Graph()
    x = g.add_value(TensorValue(torch.float32, (3, 13, 7), (3, 13, 7)))
    src = g.add_value(TensorValue(torch.float32, (3, SymExpr("s0"), 7), (3, 5, 7)))
    pos = g.add_value(TensorValue(torch.int64, (1,), (1,)))
    dst = g.add_value(TensorValue(torch.float32, (3, 13, 7), (3, 13, 7)))
    out = g.add_value(TensorValue(torch.float32, (3, 13, 7), (3, 13, 7)))
    g.inputs, g.outputs = [x, src, pos], [out]
    g.symbols = [SymbolBinding("s0", 1, 1), SymbolBinding("u0", 2, -1)]
    g.nodes = [Node("neg", [x], [dst]),
               Node("slice_scatter_" if in_place else "slice_scatter", [dst, src], [out],
                    {"dim": 1, "start": SymExpr("u0"), "src_dims": []})]
    return g


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("kind", EXECUTORS)
def test_slice_scatter_matches_a_float64_reference_at_every_offset(kind, in_place):
    g = blob.decode(blob.encode(_scatter_graph(in_place)))   # the decoder accepts both forms
    ex = executor(kind, g)
    try:
        for rows, pos in ((5, 0), (1, 12), (3, 7), (2, 11)):
            x, src = torch.randn(3, 13, 7), torch.randn(3, rows, 7)
            want = -x.double()
            want[:, pos:pos + rows] = src.double()
            got = ex.execute([x, src, torch.tensor([pos])])[0]
            torch.testing.assert_close(got.double(), want, **tol("shape", kind))
        with pytest.raises(InputError, match="slice_scatter rows"):
            ex.execute([torch.randn(3, 13, 7), torch.randn(3, 2, 7), torch.tensor([12])])
        assert ex.plan.stats.misses == 4   # one plan per T; the offset keys none
    finally:
        ex.destroy()


def test_an_in_place_write_whose_input_is_read_later_is_refused_by_the_decoder():
    g = _scatter_graph(in_place=True)
    g.outputs.append(g.nodes[1].inputs[0])   # dst is also an output: read after the write
    with pytest.raises(BlobError, match="nothing reads later"):
        blob.decode(blob.encode(g))


def test_a_state_update_of_another_shape_is_refused_by_the_decoder():
    g = Graph()
    s = g.add_value(TensorValue(torch.float32, (4,), (4,), "etwgpu.s", state=True))
    x = g.add_value(TensorValue(torch.float32, (5,), (5,)))
    g.inputs, g.outputs, g.state_updates = [x], [x], [StateUpdate(s, x)]
    with pytest.raises(BlobError, match="state update 0"):
        blob.decode(blob.encode(g))


class ReadsAfterWrite(torch.nn.Module):
    """y is read after a write into it: the write must not happen in y's buffer."""

    def forward(self, x, v, input_pos):
        pos = input_pos[0].item()
        torch._check(pos >= 0)
        torch._check(pos + v.shape[1] <= x.shape[1])
        y = x * 2
        z = torch.ops.aten.index_put.default(y, [None, torch.arange(v.shape[1]) + pos], v)
        return z + y


@pytest.mark.parametrize("device", EXECUTORS)
def test_a_write_into_a_value_read_later_is_lowered_as_a_copy(device):
    args = (torch.randn(2, 9, 3), torch.randn(2, 4, 3), torch.tensor([5]))
    pm = lower(ReadsAfterWrite(), args, device=device)
    assert undelegated_ops(pm) == []
    prog = Runtime.get().load_program(pm.buffer, device=device)
    try:
        m = prog.load_method("forward")
        (backend, handle), = m.delegates
        ops = backend.describe(handle)["ops"]
        assert "slice_scatter" in ops and "slice_scatter_" not in ops
        for pos in (0, 5, 3):
            a = (torch.randn(2, 9, 3), torch.randn(2, 4, 3), torch.tensor([pos]))
            torch.testing.assert_close(m.execute(list(a))[0], ReadsAfterWrite()(*a))
    finally:
        prog.destroy()


class ResettingState(torch.nn.Module):
    """Gated DeltaNet's state handling (ExecuTorch's AttentionGatedDeltaNet): the state is
    zeroed where input_pos[0] == 0 (a 0-d select of the int64 position, eq, a cast to float,
    1 - reset, mul_), then overwritten with its next value through copy_."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(1, 5, 3))

    def forward(self, x, input_pos):
        keep = 1.0 - (input_pos[0] == 0).to(self.state.dtype)
        self.state[:1].mul_(keep)
        new = self.state * 0.5 + x
        with torch.no_grad():
            self.state[:1].copy_(new)
        return new * 2


@pytest.mark.parametrize("device", EXECUTORS)
def test_a_state_reset_at_position_0_and_its_copy_write_stay_in_the_delegate(device):
    pm = lower(ResettingState(), (torch.randn(1, 5, 3), torch.tensor([0])), device=device)
    assert undelegated_ops(pm) == []
    prog = Runtime.get().load_program(pm.buffer, device=device)
    try:
        m = prog.load_method("forward")
        (backend, handle), = m.delegates
        assert backend.describe(handle)["state_bytes"] == 5 * 3 * 4
        eager = ResettingState()
        for pos in (0, 1, 2, 0, 3):   # the second 0 starts a new sequence: the state resets
            a = (torch.randn(1, 5, 3), torch.tensor([pos]))
            torch.testing.assert_close(m.execute(list(a))[0], eager(*a), **tol("model", device))
    finally:
        prog.destroy()


def test_a_version_2_blob_is_refused_with_a_reexport_hint():
    data = bytearray(blob.encode(_scatter_graph(in_place=False)))
    data[4:8] = (2).to_bytes(4, "little")   # the header's version; the CRC covers the body
    with pytest.raises(BlobError, match="expected 3, got 2 .*re-export the model"):
        blob.decode(bytes(data))

"""Bad input to our delegate gets a typed error that says what was expected and what came."""
import pytest
import torch

from delegate import blob
from delegate.errors import (BlobError, DelegateError, DeviceError, InputError,
                             UnknownOperatorError)
from delegate.ir import Graph, Node, SymbolBinding, SymExpr, TensorValue
from delegate.runtime.backends import InitContext
from delegate.runtime.wgpu_backend import WgpuRuntimeBackend


def _relu_graph(op: str = "relu") -> Graph:
    g = Graph()
    x = g.add_value(TensorValue(torch.float32, (SymExpr("s0"), 3), (8, 3)))
    y = g.add_value(TensorValue(torch.float32, (SymExpr("s0"), 3), (8, 3)))
    g.inputs, g.outputs, g.symbols = [x], [y], [SymbolBinding("s0", 0, 0)]
    g.nodes = [Node(op, [x], [y])]
    return g


def _init(graph_or_bytes, device="cpu"):
    data = graph_or_bytes if isinstance(graph_or_bytes, bytes) else blob.encode(graph_or_bytes)
    return WgpuRuntimeBackend().init(data, InitContext({}, lambda k: b"", device))


def test_a_valid_blob_runs_at_a_live_size():
    ex = _init(_relu_graph())
    x = torch.randn(5, 3)
    (y,) = ex.execute([x])
    torch.testing.assert_close(y, torch.relu(x))
    ex.destroy()


def test_unknown_operator_in_blob_raises_unknown_operator_error():
    with pytest.raises(UnknownOperatorError, match="frobnicate"):
        _init(_relu_graph("frobnicate"))


def test_bad_magic_raises_blob_error():
    data = blob.encode(_relu_graph())
    with pytest.raises(BlobError, match="magic"):
        _init(b"JUNK" + data[4:])


def test_unknown_schema_version_raises_blob_error():
    data = blob.encode(_relu_graph())
    with pytest.raises(BlobError, match="schema version: expected 3, got 7"):
        _init(data[:4] + (7).to_bytes(4, "little") + data[8:])


def test_out_of_range_output_id_raises_blob_error():
    g = _relu_graph()
    g.outputs = [9]
    with pytest.raises(BlobError, match="graph output 0"):
        _init(g)


@pytest.mark.parametrize("inputs, message", [
    ([], "input count: expected 1, got 0"),
    ([torch.randn(5, 3), torch.randn(5, 3)], "input count: expected 1, got 2"),
    ([torch.randn(5, 3, dtype=torch.float64)], "dtype: expected torch.float32, got torch.float64"),
    ([torch.randn(5)], "rank: expected 2, got 1"),
    ([torch.randn(5, 4)], r"shape: expected \(s0, 3\)"),
    ([torch.randn(9, 3)], "dim 0: expected at most 8, got 9"),
    (["not a tensor"], "expected a torch.float32 tensor, got str"),
])
def test_wrong_inputs_raise_input_error(inputs, message):
    ex = _init(_relu_graph())
    with pytest.raises(InputError, match=message):
        ex.execute(inputs)
    ex.destroy()


def test_unknown_device_raises_device_error():
    with pytest.raises(DeviceError, match="expected one of"):
        _init(_relu_graph(), device="tpu")


def test_missing_weight_bytes_raise_blob_error():
    g = _relu_graph("add")
    w = g.add_value(TensorValue(torch.float32, (3,), (3,), "etwgpu.w"))
    g.nodes[0].inputs.append(w)
    g.nodes[0].attrs = {"other": None, "alpha": 1.0}
    with pytest.raises(BlobError, match="weight etwgpu.w: expected 12 bytes"):
        _init(g)


def test_every_error_class_is_a_delegate_error():
    for cls in (BlobError, DeviceError, InputError, UnknownOperatorError):
        assert issubclass(cls, DelegateError)

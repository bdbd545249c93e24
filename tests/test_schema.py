"""The committed generated code matches schemas/delegate.fbs, and the blob round-trips."""
import filecmp
import pathlib
import subprocess

import executorch
import pytest
import torch

from delegate import blob
from delegate.errors import BlobError, DelegateError
from delegate.ir import Graph, Node, SymbolBinding, SymExpr, TensorValue

ROOT = pathlib.Path(__file__).resolve().parents[1]
FLATC = pathlib.Path(list(executorch.__path__)[0]) / "data" / "bin" / "flatc"


def test_generated_code_matches_fbs(tmp_path):
    subprocess.run([str(FLATC), "--python", "--gen-object-api", "-o", str(tmp_path),
                    str(ROOT / "schemas" / "delegate.fbs")], check=True)
    fresh = tmp_path / "schemas" / "etwgpu_fb"
    committed = ROOT / "schemas" / "etwgpu_fb"
    fresh_files = sorted(p.name for p in fresh.glob("*.py"))
    assert fresh_files == sorted(p.name for p in committed.glob("*.py"))
    _, mismatch, errors = filecmp.cmpfiles(fresh, committed, fresh_files, shallow=False)
    assert not mismatch and not errors, f"regenerate with flatc: {mismatch + errors}"


def _graph() -> Graph:
    g = Graph()
    x = g.add_value(TensorValue(torch.float32, (SymExpr("s0"), 5), (11, 5)))
    w = g.add_value(TensorValue(torch.float32, (7, 5), (7, 5), "etwgpu.w"))
    y = g.add_value(TensorValue(torch.float32, (SymExpr("s0"), 7), (11, 7)))
    g.inputs, g.outputs, g.symbols = [x], [y], [SymbolBinding("s0", 0, 0)]
    attrs = {"none": None, "flag": True, "n": -3, "eps": 1e-5, "mode": "tanh",
             "end": SymExpr("2*s0"), "size": [SymExpr("s0"), -1, 4], "scales": [0.5, 2.0]}
    # an op the registry does not declare, so the decoder leaves its attributes unchecked
    g.nodes = [Node("example.every_attr_kind", [x, w, -1], [y], attrs, "linear_1")]
    return g


def test_blob_round_trip_keeps_every_field():
    g = _graph()
    back = blob.decode(blob.encode(g))
    assert back == g
    assert isinstance(back.nodes[0].attrs["end"], SymExpr)
    assert not isinstance(back.nodes[0].attrs["mode"], SymExpr)
    assert back.nodes[0].name == "linear_1"


@pytest.mark.parametrize("corrupt, message", [
    (lambda b: b"XXXX" + b[4:], "magic"),
    (lambda b: b[:4] + (99).to_bytes(4, "little") + b[8:], "schema version"),
    (lambda b: blob.frame(b[12:16] + b"ABCD" + b[20:]), "file identifier"),
    (lambda b: b[:30] + bytes([b[30] ^ 1]) + b[31:], "CRC32"),
    (lambda b: b[:6], "at least"),
    (lambda b: b[:40], "expected"),
])
def test_corrupted_blob_raises_blob_error(corrupt, message):
    with pytest.raises(BlobError, match=message):
        blob.decode(corrupt(blob.encode(_graph())))


def test_out_of_range_value_id_raises_blob_error():
    g = _graph()
    g.nodes[0].inputs[0] = 42
    with pytest.raises(BlobError, match=r"expected a value id in \[0, 3\), got 42"):
        blob.decode(blob.encode(g))


def test_blob_errors_are_delegate_errors():
    assert issubclass(BlobError, DelegateError)

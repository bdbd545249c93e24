"""The command line: demo, inspect and run on a real .pte."""
import re

import pytest
import torch

from delegate.aot import lower
from delegate.cli import main
from delegate.models import MLP, seeded


@pytest.fixture(scope="module")
def mlp_pte(tmp_path_factory):
    path = tmp_path_factory.mktemp("pte") / "mlp.pte"
    pm = lower(seeded(MLP(13, 29, 7)), (torch.randn(5, 13),), device="cpu")
    path.write_bytes(pm.buffer)
    return str(path)


def test_inspect_lists_methods_delegates_ops_and_device(mlp_pte, capsys):
    assert main(["inspect", mlp_pte, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "method forward: 1 input(s), 1 output(s)" in out
    assert "backend WgpuBackend, device cpu" in out
    assert re.search(r"linear x2", out) and "relu" in out


def test_run_prints_output_shapes_and_timing(mlp_pte, capsys):
    assert main(["run", mlp_pte, "--device", "cpu", "--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "output 0: (5, 7) torch.float32" in out
    assert re.search(r"forward: [0-9.]+ ms/run", out)


def test_a_missing_file_is_a_clean_error(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope.pte")]) == 2
    assert "ProgramError" in capsys.readouterr().err


def test_demo_reports_small_error_at_every_length(tmp_path, capsys):
    out_path = tmp_path / "demo.pte"
    assert main(["demo", "--out", str(out_path), "--device", "cpu", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert out_path.stat().st_size > 0
    errs = [float(m) for m in re.findall(r"^\s+\d+\s+([0-9.e+-]+)\s", out, re.M)]
    assert len(errs) == 3 and max(errs) < 1e-3, out

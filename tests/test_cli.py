"""The command line, as a newcomer meets it: help for every verb and flag, one typed line and
exit code 2 for every bad argument, the ATen kernels left outside the delegates with their
share, per-node profiles on cpu, the op table (and the README's copy of it), and quiet WebGPU
use."""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from delegate.aot import lower
from delegate.cli import VERBS, _parser, main
from delegate.models import MLP, seeded
from delegate.op_table import README, op_table, readme_section, rows

ROOT = Path(__file__).resolve().parents[1]


class LinearRemainderAbs(torch.nn.Module):
    """linear | remainder | abs + add: remainder has no kernel of ours, so it runs outside."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 5)

    def forward(self, x):
        y = self.fc(x)
        return torch.remainder(y, 0.7) + y.abs()


class ScaleBy(torch.nn.Module):
    def forward(self, x, n: int):
        return x * n


@pytest.fixture(scope="module")
def ptes(tmp_path_factory):
    """{"mlp": every op delegated, "mixed": one ATen kernel left outside, "scalar": an int
    input, nothing delegated}, built once."""
    from executorch.exir import to_edge

    d = tmp_path_factory.mktemp("pte")
    torch.manual_seed(0)
    made = {"mlp": lower(seeded(MLP(13, 29, 7)), (torch.randn(5, 13),), device="cpu"),
            "mixed": lower(LinearRemainderAbs(), (torch.randn(3, 6),), device="cpu"),
            "scalar": to_edge(torch.export.export(ScaleBy(), (torch.randn(3), 4))).to_executorch()}
    paths = {}
    for name, pm in made.items():
        paths[name] = d / f"{name}.pte"
        paths[name].write_bytes(pm.buffer)
    torch.save([torch.randn(5, 13)], d / "inputs.pt")
    torch.save({"x": torch.randn(5, 13)}, d / "dict.pt")
    torch.save([torch.randn(5, 13), "x"], d / "str.pt")
    (d / "notes.txt").write_text("not a tensor file\n")
    return {k: str(v) for k, v in paths.items()} | {"dir": d}


def cli(capsys, *argv):
    """(exit code, stdout, stderr) of `python -m delegate argv` run in this process."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, kind, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {kind}: "), err
    assert all(f in lines[0] for f in fragments), err


# ---- help ------------------------------------------------------------------------------------
def test_top_level_help_describes_every_verb(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for verb, text in VERBS.items():
        assert f"{verb} {' '.join(text.split()[:4])}" in out, verb


def test_every_verb_and_every_flag_has_help_text():
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(VERBS)
    for verb, parser in sub.choices.items():
        assert parser.description == VERBS[verb]
        for action in parser._actions:
            assert action.help, f"{verb} {action.option_strings or action.dest}: no help text"


# ---- bad arguments: one typed line, exit code 2 ----------------------------------------------
@pytest.mark.parametrize("verb", ["run", "profile"])
@pytest.mark.parametrize("inputs,fragment", [
    ("notes.txt", "expected a file written by torch.save"),
    ("missing.pt", "expected a readable file"),
    ("dict.pt", "expected a list of tensors, got dict"),
    ("str.pt", "item 1: expected a tensor, got str"),
])
def test_bad_inputs_file_is_one_input_error_line(ptes, capsys, verb, inputs, fragment):
    code, _, err = cli(capsys, verb, ptes["mlp"], "--device", "cpu",
                       "--inputs", ptes["dir"] / inputs)
    assert_one_line_error(code, err, "InputError", fragment)


@pytest.mark.parametrize("verb", ["inspect", "run", "profile"])
def test_unknown_method_is_an_error_for_every_verb(ptes, capsys, verb):
    code, out, err = cli(capsys, verb, ptes["mlp"], "--device", "cpu", "--method", "nope")
    assert_one_line_error(code, err, "ProgramError", "expected one of ['forward'], got 'nope'")
    assert out == ""


@pytest.mark.parametrize("verb", ["run", "profile", "demo"])
@pytest.mark.parametrize("runs", ["0", "-3", "two"])
def test_runs_below_one_is_a_usage_error(ptes, capsys, verb, runs):
    args = [verb] + ([ptes["mlp"]] if verb != "demo" else []) + ["--runs", runs]
    code, out, err = cli(capsys, *args)
    assert_one_line_error(code, err, "UsageError", f"expected an integer >= 1, got '{runs}'")
    assert out == ""


@pytest.mark.parametrize("argv", [[], ["frob"], ["run"], ["inspect", "x.pte", "--device", "gpu"]])
def test_argparse_errors_are_one_usage_error_line(capsys, argv):
    code, _, err = cli(capsys, *argv)
    assert_one_line_error(code, err, "UsageError", "--help")


def test_a_missing_pte_is_a_clean_error(tmp_path, capsys):
    code, _, err = cli(capsys, "inspect", tmp_path / "nope.pte")
    assert_one_line_error(code, err, "ProgramError", "nope.pte")


def test_a_bad_argument_from_the_shell_gives_no_traceback(ptes):
    got = subprocess.run([sys.executable, "-m", "delegate", "run", ptes["mlp"], "--inputs",
                          str(ptes["dir"] / "notes.txt")], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == [got.stderr.strip()], got.stderr
    assert "Traceback" not in got.stderr and got.stderr.startswith("error: InputError: ")


# ---- what the verbs print ----------------------------------------------------------------------
def test_inspect_lists_methods_delegates_ops_and_device(ptes, capsys):
    code, out, _ = cli(capsys, "inspect", ptes["mlp"], "--device", "cpu")
    assert code == 0
    assert "method forward: 1 input(s), 1 output(s)" in out
    assert "backend WgpuBackend, device cpu" in out
    assert re.search(r"linear x2", out) and "relu" in out
    assert "ATen kernels outside the delegates: none" in out


def test_inspect_lists_the_aten_kernels_outside_with_their_share(ptes, capsys):
    code, out, _ = cli(capsys, "inspect", ptes["mixed"], "--device", "cpu", "--method", "forward")
    assert code == 0
    # linear, abs, add delegated (two calls around remainder); remainder is 1 of the 4 ops
    assert "delegated: 3 of 4 op(s), in 2 delegate call(s)" in out
    assert re.search(r"aten::remainder\.\w+\s+x1\s+25\.0%", out), out


def test_run_prints_outputs_timing_and_the_aten_kernels_outside(ptes, capsys):
    code, out, _ = cli(capsys, "run", ptes["mixed"], "--device", "cpu", "--runs", "2")
    assert code == 0
    assert "output 0: (3, 5) torch.float32" in out
    assert re.search(r"forward: [0-9.]+ ms/run \(min of 2\)", out)
    assert re.search(r"aten::remainder\.\w+\s+1\s+[0-9.]+\s+[0-9.]+%", out), out


def test_run_takes_inputs_from_a_file(ptes, capsys):
    code, out, _ = cli(capsys, "run", ptes["mlp"], "--device", "cpu", "--runs", "1",
                       "--inputs", ptes["dir"] / "inputs.pt")
    assert code == 0 and "output 0: (5, 7) torch.float32" in out


def test_run_feeds_a_scalar_input_its_exported_value(ptes, capsys):
    code, out, _ = cli(capsys, "run", ptes["scalar"], "--runs", "1")
    assert code == 0 and "output 0: (3,) torch.float32" in out
    assert re.search(r"aten::mul\.out\s+1\s", out), out


def test_profile_on_cpu_times_each_node_by_op_name(ptes, capsys):
    code, out, _ = cli(capsys, "profile", ptes["mlp"], "--device", "cpu", "--runs", "2")
    assert code == 0
    rows_ = re.findall(r"^\s+\d+\s+0\s+(.+?)\s+[0-9.]+\s+wall$", out, re.M)
    assert len(rows_) == 3 and sum("linear" in r for r in rows_) == 2 and "relu" in rows_[1], out


def test_profile_shares_split_the_method_between_delegates_and_aten(ptes, capsys):
    code, out, _ = cli(capsys, "profile", ptes["mixed"], "--device", "cpu", "--runs", "2")
    assert code == 0
    assert re.search(r"aten::remainder\.\w+\s+1\s+[0-9.]+\s+[0-9.]+%", out), out
    shares = [float(s) for s in re.findall(r"\(([0-9.]+)%\)", out.splitlines()[-1])]
    assert len(shares) == 3 and shares[1] > 0 and abs(sum(shares) - 100) < 0.5, out


def test_profile_falls_back_to_whole_delegate_rows_without_execute_profiled(ptes, capsys,
                                                                            monkeypatch):
    from delegate.runtime import cpu_executor

    monkeypatch.delattr(cpu_executor.CpuExecutor, "execute_profiled", raising=False)
    code, out, _ = cli(capsys, "profile", ptes["mixed"], "--device", "cpu", "--runs", "1")
    assert code == 0
    assert len(re.findall(r"DelegateCall \(whole\)", out)) == 2, out


def test_demo_reports_small_error_at_every_length(tmp_path, capsys):
    out_path = tmp_path / "demo.pte"
    code, out, _ = cli(capsys, "demo", "--out", out_path, "--device", "cpu", "--runs", "1")
    assert code == 0 and out_path.stat().st_size > 0
    assert "ATen kernels outside the delegates: none" in out
    errs = [float(m) for m in re.findall(r"^\s+\d+\s+([0-9.e+-]+)\s", out, re.M)]
    assert len(errs) == 3 and max(errs) < 1e-3, out


# ---- the op table -------------------------------------------------------------------------------
def test_ops_prints_every_registered_op_with_its_kernels(capsys):
    from delegate.ops import all_ops

    code, out, _ = cli(capsys, "ops")
    assert code == 0
    listed = {ln.split()[0] for ln in out.splitlines()[1:] if ln.strip() and " ops: " not in ln}
    assert listed == set(all_ops())
    assert re.search(r"^linear\s+float32\s+yes\s+yes\s+aten\.linear\.default$", out, re.M)
    assert re.search(r"^sym_size\s+-\s+folded\s+folded\s", out, re.M)


def test_op_table_reads_the_kernel_registries():
    import kernels_cpu
    import kernels_wgsl

    for name, _, cpu, webgpu, _ in rows():
        if cpu != "folded":
            assert (cpu == "yes") == kernels_cpu.has_kernel(name)
            assert (webgpu == "yes") == kernels_wgsl.has_kernel(name)


def test_readme_op_table_matches_the_registry():
    section = readme_section(README.read_text())
    assert section, "README.md has no generated op table section"
    assert section == op_table(markdown=True), \
        "README.md's op table drifted from the registry: run `python -m delegate.op_table`"


# ---- quiet by default, no import cycle -----------------------------------------------------------
def test_webgpu_use_prints_no_error_lines_on_stderr(ptes):
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "NODEVICE_SELECT")}
    got = subprocess.run([sys.executable, "-m", "delegate", "run", ptes["mlp"], "--device",
                          "webgpu", "--runs", "1"], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=300)
    assert got.returncode == 0, got.stderr
    assert "output 0: (5, 7) torch.float32" in got.stdout
    assert not re.search(r"(?m)^error:", got.stderr), got.stderr
    assert "XDG_RUNTIME_DIR" not in got.stderr


def test_demo_does_not_import_the_cli():
    code = "import sys, delegate.demo; assert 'delegate.cli' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=300)

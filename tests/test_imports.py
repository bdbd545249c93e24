"""Imports run one way: schemas <- delegate <- runtime -> kernels. Loading and running a .pte
needs no export-time code, and no kernel module knows the op registry."""
import ast
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
EXPORT_TIME = ("delegate.partitioner", "delegate.preprocess", "delegate.lowering", "delegate.aot",
               "delegate.demo")


def _imports(path: Path) -> set:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_kernel_module_imports_the_op_registry():
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in _imports(p)
                                                   if m.startswith("delegate.ops"))
                 for d in ("kernels_cpu", "kernels_wgsl") for p in (ROOT / d).glob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_runtime_loads_and_runs_a_pte_without_export_time_code(tmp_path):
    from delegate.aot import lower
    from delegate.models import MLP, seeded

    path = tmp_path / "mlp.pte"
    path.write_bytes(lower(seeded(MLP(13, 29, 7)), (torch.randn(5, 13),), device="cpu").buffer)
    code = (
        "import sys, torch\n"
        "from delegate.runtime.program import Runtime\n"
        f"p = Runtime.get().load_program({str(path)!r}, device='cpu')\n"
        "p.load_method('forward').execute([torch.randn(5, 13)])\n"
        "p.destroy()\n"
        f"print(sorted(m for m in sys.modules if m in {EXPORT_TIME!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_cli_does_not_import_the_demo_at_module_level():
    assert "delegate.demo" not in _imports(ROOT / "delegate" / "cli.py") or \
        "delegate.cli" not in _imports(ROOT / "delegate" / "demo.py")

"""The plugin seam: a third-party distribution adds an op, its CPU kernel and a runner backend
through entry points, and a model using the op is delegated and runs."""
import sys
import textwrap

import pytest
import torch

import kernels_cpu
from delegate import ops as registry
from delegate.aot import lower, undelegated_ops
from delegate.runtime import backends
from delegate.runtime.program import Runtime

@torch.library.custom_op("etwgpu_test::triple", mutates_args=())
def triple(x: torch.Tensor) -> torch.Tensor:
    """An op no registry of ours knows: only the plugin below can claim it."""
    return x * 3.0


@triple.register_fake
def _(x):
    return torch.empty_like(x)


PLUGIN = '''
import torch
from delegate.lowering import simple_lower
from delegate.ops import register_op
from delegate.runtime.backends import PyBackend
from kernels_cpu import register_kernel

register_op("plugin_triple", targets=("etwgpu_test.triple.default",),
            infer=lambda shapes, attrs: [shapes[0]], lower=simple_lower("plugin_triple"))


@register_kernel("plugin_triple")
def plugin_triple(ins, outs, attrs, scratch):
    torch.mul(ins[0], 3.0, out=outs[0])


class EchoBackend(PyBackend):
    backend_id = "EchoBackend"
'''

ENTRY_POINTS = '''
[etwgpu.ops]
plugin = etwgpu_test_plugin
[etwgpu.kernels]
plugin = etwgpu_test_plugin
[etwgpu.backends]
EchoBackend = etwgpu_test_plugin:EchoBackend
'''


@pytest.fixture
def plugin_installed(tmp_path, monkeypatch):
    (tmp_path / "etwgpu_test_plugin.py").write_text(PLUGIN)
    dist = tmp_path / "etwgpu_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: etwgpu-test-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent(ENTRY_POINTS))
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in (registry, kernels_cpu, backends):
        monkeypatch.setattr(mod, "_loaded", False)
    yield
    # Leave the registries as they were for the other tests.
    registry._OPS.pop("plugin_triple", None)
    registry._BY_TARGET.pop("etwgpu_test.triple.default", None)
    kernels_cpu._KERNELS.pop("plugin_triple", None)
    backends._BACKENDS.pop("EchoBackend", None)
    sys.modules.pop("etwgpu_test_plugin", None)


def test_entry_points_add_an_op_a_kernel_and_a_backend(plugin_installed):
    assert registry.get_op("plugin_triple").targets == ("etwgpu_test.triple.default",)
    assert kernels_cpu.has_kernel("plugin_triple")
    assert type(backends.get_backend("EchoBackend")).__name__ == "EchoBackend"


def test_a_model_using_a_plugin_op_is_delegated_and_runs(plugin_installed):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.etwgpu_test.triple(x) + 1.5

    x = torch.randn(3, 7)
    pm = lower(M(), (x,), device="cpu")
    assert undelegated_ops(pm) == []
    prog = Runtime.get().load_program(pm.buffer, device="cpu")
    (got,) = prog.load_method("forward").execute([x])
    prog.destroy()
    torch.testing.assert_close(got, x * 3.0 + 1.5)

"""device="auto" prefers a real GPU: a hardware adapter means webgpu, a software rasteriser
(lavapipe, SwiftShader, WARP) means cpu unless webgpu is asked for by name; the log says
which and why."""
import logging
from types import SimpleNamespace

import pytest
import torch

from delegate.ir import Graph, Node, TensorValue
from delegate.runtime.wgpu_backend import choose_device
from kernels_wgsl import device as wgsl_device


def relu_graph():
    g = Graph()
    x = g.add_value(TensorValue(torch.float32, (3, 5), (3, 5)))
    y = g.add_value(TensorValue(torch.float32, (3, 5), (3, 5)))
    g.inputs, g.outputs, g.nodes = [x], [y], [Node("relu", [x], [y])]
    return g


@pytest.fixture
def adapter_kind(monkeypatch):
    """Make this machine's adapter read as software (True) or hardware (False)."""
    gpu = wgsl_device.get_device()

    def set_kind(software: bool):
        monkeypatch.setattr(gpu, "software", software)
        return gpu
    return set_kind


def test_auto_takes_a_hardware_adapter_and_says_so(adapter_kind, caplog):
    gpu = adapter_kind(False)
    with caplog.at_level(logging.INFO, logger="etwgpu"):
        assert choose_device("auto", relu_graph()) == "webgpu"
    assert f"device auto -> webgpu (hardware adapter {gpu.name})" in caplog.text


def test_auto_prefers_the_cpu_kernels_to_a_software_adapter_and_says_why(adapter_kind, caplog):
    gpu = adapter_kind(True)
    with caplog.at_level(logging.INFO, logger="etwgpu"):
        assert choose_device("auto", relu_graph()) == "cpu"
    assert "device auto -> cpu" in caplog.text and gpu.name in caplog.text
    assert "software rasteriser" in caplog.text and "device='webgpu'" in caplog.text


def test_webgpu_by_name_uses_a_software_adapter(adapter_kind):
    adapter_kind(True)
    assert choose_device("webgpu", relu_graph()) == "webgpu"


@pytest.mark.parametrize("info,software", [
    ({"adapter_type": "CPU", "device": "llvmpipe (LLVM 15.0.6, 256 bits)"}, True),
    ({"adapter_type": "Unknown", "device": "SwiftShader Device (Subzero)"}, True),
    ({"adapter_type": "Unknown", "device": "Microsoft Basic Render Driver"}, True),
    ({"adapter_type": "DiscreteGPU", "device": "NVIDIA H200", "vendor": "NVIDIA"}, False),
    ({"adapter_type": "IntegratedGPU", "device": "Apple M2", "vendor": "apple"}, False),
])
def test_software_adapters_are_told_by_type_or_name(info, software):
    assert wgsl_device.software_adapter(SimpleNamespace(info=info)) is software


"""The runner-side WgpuBackend: decode the blob, pick the executor, own what it creates.

The blob is portable: the device is chosen at load. "auto" takes WebGPU when a hardware
adapter exists and every op of the graph has a WGSL kernel, otherwise the CPU executor, and logs
which and why.
"""
from __future__ import annotations

import logging
import math

import torch

from delegate import blob, integrity
from delegate.errors import BlobError, DeviceError
from delegate.ir import TensorValue
from delegate.runtime.backends import InitContext, PyBackend

log = logging.getLogger("etwgpu")
DEVICES = ("auto", "webgpu", "cpu")


class WgpuRuntimeBackend(PyBackend):
    backend_id = "WgpuBackend"
    writes_outputs = True

    def init(self, processed: bytes, ctx: InitContext):
        graph = blob.decode(processed)
        weights = _load_weights(graph, ctx)
        adapter = ctx.options.get("adapter")
        device = choose_device(ctx.device, graph, adapter)
        if device == "webgpu":
            from delegate.runtime.webgpu_executor import WebGpuExecutor

            return WebGpuExecutor(graph, weights, adapter=adapter)
        from delegate.runtime.cpu_executor import CpuExecutor

        return CpuExecutor(graph, weights)

    def execute(self, handle, inputs: list, outputs: list | None = None) -> list:
        return handle.execute(inputs, outputs)

    def destroy(self, handle) -> None:
        handle.destroy()

    def describe(self, handle) -> dict:
        return handle.describe()


def choose_device(requested: str, graph, adapter: str | None = None) -> str:
    """"cpu" or "webgpu" for this graph. "auto" takes WebGPU only on a hardware adapter: a
    software one (lavapipe, SwiftShader, WARP) runs slower than the CPU kernels, so it is
    used only when "webgpu" is asked for by name. "auto" logs which and why."""
    if requested not in DEVICES:
        raise DeviceError(f"device: expected one of {DEVICES}, got {requested!r}")
    if requested == "cpu":
        return "cpu"
    why_not, gpu = _webgpu_unavailable(graph, adapter)
    if requested == "webgpu":
        if why_not:
            raise DeviceError(f"device 'webgpu': expected a usable WebGPU executor, got: {why_not}")
        return "webgpu"
    if why_not:
        log.info("etwgpu: device auto -> cpu (%s)", why_not)
        return "cpu"
    if gpu.software:
        log.info("etwgpu: device auto -> cpu (the WebGPU adapter %s is a software rasteriser, "
                 "slower than the CPU kernels; device='webgpu' uses it anyway)", gpu.name)
        return "cpu"
    log.info("etwgpu: device auto -> webgpu (hardware adapter %s)", gpu.name)
    return "webgpu"


def _webgpu_unavailable(graph, adapter: str | None) -> tuple:
    """("", the GpuDevice) when WebGPU can run this graph, else (the reason it cannot, None)."""
    try:
        import kernels_cpu
        import kernels_wgsl
        from delegate.runtime import webgpu_executor  # noqa: F401
        from kernels_wgsl.device import get_device
    except ImportError as e:
        return f"the WebGPU executor is not available ({e})", None
    missing = sorted({n.op for n in graph.nodes if not kernels_wgsl.has_kernel(n.op)})
    unrunnable = [op for op in missing if not kernels_cpu.has_kernel(op)]
    if unrunnable:
        return f"no WGSL or CPU kernel for {unrunnable}", None
    if missing:   # run inside the WebGPU load on the CPU kernels (delegate/runtime/cpu_fallback)
        log.info("etwgpu: webgpu runs %s on the CPU kernels (no WGSL kernel)", missing)
    try:
        return "", get_device(adapter)
    except DeviceError as e:
        return str(e), None


def _load_weights(graph, ctx: InitContext) -> dict:
    """constant key -> tensor, from the .pte's named data (one copy, owned by the executor).

    Each weight's bytes are checked against its key (load option verify, delegate/integrity.py),
    once per process per Program that owns them."""
    weights = {v.constant_key: v for v in graph.values
               if isinstance(v, TensorValue) and v.constant_key}
    itemsize = {v.dtype: torch.empty((), dtype=v.dtype).element_size() for v in weights.values()}
    total = sum(math.prod(v.max_shape) * itemsize[v.dtype] for v in weights.values())
    mode = integrity.resolve_mode(ctx.options.get("verify", "auto"), total)
    owner = getattr(ctx.named_data, "__self__", None)   # the Program, when there is one
    out = {}
    for key, v in weights.items():
        data = ctx.named_data(key)
        n = math.prod(v.max_shape)
        if len(data) != n * itemsize[v.dtype]:
            raise BlobError(
                f"weight {key}: expected {n * itemsize[v.dtype]} bytes for {v.max_shape} "
                f"{v.dtype}, got {len(data)}"
            )
        integrity.verify_weight(key, data, v.dtype, v.max_shape, mode, owner)
        buf = bytearray(data)
        out[key] = (torch.frombuffer(buf, dtype=v.dtype).view(v.max_shape) if n
                    else torch.empty(v.max_shape, dtype=v.dtype))
    return out

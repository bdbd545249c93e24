"""The runner-side WgpuBackend: decode the blob, pick the executor, own what it creates.

The blob is portable: the device is chosen at load. "auto" takes WebGPU when an adapter exists
and every op of the graph has a WGSL kernel, otherwise the CPU executor, and logs which and why.
"""
from __future__ import annotations

import logging

import torch

from delegate import blob
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
    if requested not in DEVICES:
        raise DeviceError(f"device: expected one of {DEVICES}, got {requested!r}")
    if requested == "cpu":
        return "cpu"
    why_not = _webgpu_unavailable(graph, adapter)
    if requested == "webgpu":
        if why_not:
            raise DeviceError(f"device 'webgpu': expected a usable WebGPU executor, got: {why_not}")
        return "webgpu"
    if why_not:
        log.info("etwgpu: device auto -> cpu (%s)", why_not)
        return "cpu"
    log.info("etwgpu: device auto -> webgpu")
    return "webgpu"


def _webgpu_unavailable(graph, adapter: str | None) -> str:
    """Empty when WebGPU can run this graph, else the reason it cannot."""
    try:
        import kernels_wgsl
        from delegate.runtime import webgpu_executor  # noqa: F401
    except ImportError as e:
        return f"the WebGPU executor is not available ({e})"
    missing = sorted({n.op for n in graph.nodes if not kernels_wgsl.has_kernel(n.op)})
    if missing:
        return f"no WGSL kernel for {missing}"
    reason = kernels_wgsl.adapter_unavailable(adapter)
    return reason or ""


def _load_weights(graph, ctx: InitContext) -> dict:
    """constant key -> tensor, from the .pte's named data (one copy, owned by the executor)."""
    out = {}
    for v in graph.values:
        if not (isinstance(v, TensorValue) and v.constant_key) or v.constant_key in out:
            continue
        data = ctx.named_data(v.constant_key)
        itemsize = torch.empty((), dtype=v.dtype).element_size()
        n = 1
        for s in v.max_shape:
            n *= s
        if len(data) != n * itemsize:
            raise BlobError(
                f"weight {v.constant_key}: expected {n * itemsize} bytes for {v.max_shape} "
                f"{v.dtype}, got {len(data)}"
            )
        buf = bytearray(data)
        out[v.constant_key] = (
            torch.frombuffer(buf, dtype=v.dtype).view(v.max_shape) if n else torch.empty(v.max_shape, dtype=v.dtype)
        )
    return out

"""The process-wide WebGPU device: adapter choice, features, limits, and the pipeline cache.

One GPUDevice serves every loaded delegate (like tinygrad's WebGpuDevice). The adapter is the
high-performance one unless ETWGPU_ADAPTER (or a load option passed as `selector`) names
another: a case-insensitive substring of the adapter's device/vendor/description or its
backend ("llvmpipe", "nvidia", "vulkan", "metal").
shader-f16 and timestamp-query are requested only when offered, and limits only up to what the
adapter offers. Only the native compute backends (Vulkan, Metal, D3D12) are enumerated.

Pipelines are cached by (shader source, entry point, constants, binding layout) and counted:
an executor acquires the pipelines it uses and releases them in destroy(). Unused pipelines
stay in a small idle pool so a reload does not recompile, and the pool is bounded so loading
and destroying models never grows it.
"""
from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from delegate.errors import DeviceError, ShaderError

log = logging.getLogger("etwgpu")

ADAPTER_ENV = "ETWGPU_ADAPTER"
OPTIONAL_FEATURES = ("shader-f16", "timestamp-query", "subgroup")
# Limits raised to what the adapter offers: big weights and activations need the buffer sizes,
# attention's register-blocked prefill tiles the workgroup storage (lavapipe 32 KiB, NVIDIA
# 48 KiB, against WebGPU's default 16 KiB).
RAISED_LIMITS = ("max-buffer-size", "max-storage-buffer-binding-size",
                 "max-compute-workgroup-storage-size")
IDLE_PIPELINES = 64

# GL (EGL) adds nothing for compute: on a CPU-only box it is a second llvmpipe adapter.
NATIVE_BACKENDS = ("Vulkan", "Metal", "DX12")
# Software rasterisers whose adapter_type may not say CPU (WARP reports itself by this name).
SOFTWARE_ADAPTERS = ("llvmpipe", "lavapipe", "swiftshader", "microsoft basic render driver")

_DEVICES: dict = {}   # adapter selector -> GpuDevice
_instance_ready = False


def adapter_selector() -> str:
    return os.environ.get(ADAPTER_ENV, "").strip()


def _prepare_instance() -> None:
    """Before wgpu's process-wide instance exists: native backends only, and no Mesa noise."""
    global _instance_ready
    if _instance_ready:
        return
    _instance_ready = True
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR", "")
    if not os.path.isdir(runtime_dir) and "MESA_VK_DEVICE_SELECT" not in os.environ:
        # Mesa's Vulkan device-select layer asks Wayland for the display's GPU, and without a
        # session libwayland prints "error: XDG_RUNTIME_DIR is invalid" to stderr. With no
        # session there is no display GPU to find, so the layer has nothing to add.
        os.environ.setdefault("NODEVICE_SELECT", "1")
    from wgpu.backends.wgpu_native.extras import set_instance_extras

    try:
        set_instance_extras(backends=list(NATIVE_BACKENDS))
    except RuntimeError:  # the embedding program created the instance first: keep its choice
        pass


def software_adapter(adapter) -> bool:
    """True for a CPU rasteriser (lavapipe, SwiftShader, WARP): WebGPU that runs on the CPU."""
    info = adapter.info
    name = f"{info.get('device', '')} {info.get('vendor', '')} {info.get('description', '')}"
    return str(info.get("adapter_type", "")).lower() == "cpu" or \
        any(s in name.lower() for s in SOFTWARE_ADAPTERS)


def _describe_adapter(adapter) -> str:
    info = adapter.info
    return f"{info.get('device', '?')} [{info.get('backend_type', '?')}, {info.get('adapter_type', '?')}]"


def _matches(adapter, selector: str) -> bool:
    info = adapter.info
    text = " ".join(str(info.get(k, "")) for k in
                    ("device", "vendor", "description", "backend_type", "adapter_type"))
    return selector.lower() in text.lower()


def pick_adapter(selector: str):
    """The adapter to use, or DeviceError saying which adapters exist and what was asked."""
    import wgpu

    _prepare_instance()
    try:
        if not selector:
            adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
            if adapter is None:
                raise DeviceError("WebGPU adapter: expected one, got none")
            return adapter
        adapters = wgpu.gpu.enumerate_adapters_sync()
    except DeviceError:
        raise
    except Exception as e:  # wgpu raises plain RuntimeError when no backend finds an adapter
        raise DeviceError(f"WebGPU adapter: expected one, got {type(e).__name__}: {e}") from e
    for adapter in adapters:
        if _matches(adapter, selector):
            return adapter
    names = [_describe_adapter(a) for a in adapters] or ["none"]
    raise DeviceError(f"WebGPU adapter: expected one matching {ADAPTER_ENV}={selector!r}, "
                      f"got {names}")


@dataclass
class _CachedPipeline:
    pipeline: object
    layout: object        # GPUBindGroupLayout the executor's bind groups use
    users: int = 0


@dataclass(frozen=True)
class RawPassCalls:
    """wgpu-native's compute-pass calls without wgpu-py's per-call error capture.

    wgpu-py wraps every C call in a proxy that captures and re-raises validation errors; for
    the three calls of a dispatch that costs ~2 µs each, most of the host time of a decode
    step (cProfile on the H200: proxy_func 54% of execute). Pass commands are validated when
    the encoder finishes (WebGPU's deferred errors), and that call stays proxied, so an
    invalid dispatch still raises a GPUValidationError from our finish()."""
    set_pipeline: object
    set_bind_group: object
    dispatch: object
    null: object

    @staticmethod
    def handle(obj):
        """The C handle of a wgpu-py object (kept alive by the object itself)."""
        return obj._internal


def raw_pass_calls():
    """RawPassCalls, or None when wgpu-py's native backend does not expose them or
    ETWGPU_CHECKED_ENCODE=1 asks for wgpu-py's checked calls."""
    if os.environ.get("ETWGPU_CHECKED_ENCODE") == "1":
        return None
    try:
        from wgpu.backends.wgpu_native._ffi import ffi, lib

        return RawPassCalls(lib.wgpuComputePassEncoderSetPipeline,
                            lib.wgpuComputePassEncoderSetBindGroup,
                            lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)
    except (ImportError, AttributeError):   # another wgpu-py backend or layout
        return None


class NativeMap:
    """wgpu-native's buffer-map and queue-write calls without wgpu-py's promise, poll thread
    and per-call wrappers.

    wgpu-py's map_sync makes a promise and a cffi callback per call, wakes its per-device poll
    thread and waits on an event that thread sets: a thread wake and two GIL handoffs on every
    readback. Here one callback lives as long as the device, and the calling thread polls
    (wgpuDevicePoll with wait, which also runs the callback). The calls are raw, as
    RawPassCalls' are: a refused map reaches the callback as an error status, which map()
    raises as DeviceError. wgpu-py never sees these buffers mapped, so they are mapped only
    through here. Timings: bench/readback_probe.py --floor.

    copy_out and write move bytes between a mapped range or a queue write and a tensor's
    memory by address, without numpy views or wgpu-py's memoryview checks and error capture
    (8 KiB out: 0.47 against 2.11 us for numpy's frombuffer + copyto on the 2-core dev
    machine). Their callers own the bounds: the executor's plan sizes every buffer for the
    largest binding."""

    def __init__(self, device):
        from wgpu.backends.wgpu_native._api import ffi, lib

        self._ffi, self._device, self._status = ffi, device._internal, []
        self._map_async, self._poll = lib.wgpuBufferMapAsync, lib.wgpuDevicePoll
        self._range, self._unmap = lib.wgpuBufferGetConstMappedRange, lib.wgpuBufferUnmap
        self._read, self._success = lib.WGPUMapMode_Read, lib.WGPUMapAsyncStatus_Success
        self._write, self._queue = lib.wgpuQueueWriteBuffer, device.queue._internal
        self._mapped = ffi.NULL   # the last map's range, as char *
        self.spin_s = 0.0   # native_map() sets the adapter's
        self._callback = ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)",
                                      self._done)
        self._info = ffi.new("WGPUBufferMapCallbackInfo *")
        self._info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        self._info.callback = self._callback

    def _done(self, status, _message, _userdata1, _userdata2) -> None:
        self._status.append(status)

    def map(self, buffer, nbytes: int):
        """A cffi buffer over the mapped bytes (dangling after unmap: copy out first)."""
        self._status.clear()
        self._map_async(buffer._internal, self._read, 0, nbytes, self._info[0])
        self._spin()
        for _ in range(MAP_POLLS):   # a poll waits for the queue; the callback may run later
            if self._status:
                break
            self._poll(self._device, True, self._ffi.NULL)
        if self._status != [self._success]:
            got = self._status or f"no callback after {MAP_POLLS} polls"
            raise DeviceError(f"readback of {nbytes} bytes: expected the buffer mapped, got "
                              f"map status {got}")
        self._mapped = self._ffi.cast("char *", self._range(buffer._internal, 0, nbytes))
        return self._ffi.buffer(self._mapped, nbytes)

    def copy_out(self, address: int, offset: int, nbytes: int) -> None:
        """nbytes of the mapped range from offset to memory at address (a tensor's data_ptr)."""
        self._ffi.memmove(self._ffi.cast("void *", address), self._mapped + offset, nbytes)

    def write(self, buffer, address: int, nbytes: int) -> None:
        """nbytes at address (a tensor's data_ptr) into the start of buffer, queued as
        queue.write_buffer's are: before the next submit."""
        self._write(self._queue, buffer._internal, 0, self._ffi.cast("void *", address), nbytes)

    def _spin(self) -> None:
        """Poll without waiting for up to spin_s: a blocking poll sleeps on the driver's fence
        and is woken late (bench/readback_probe.py --floor measures both); past spin_s a long
        execute blocks instead of burning the core."""
        if self.spin_s <= 0:
            return
        poll, device, null, status = self._poll, self._device, self._ffi.NULL, self._status
        end = time.perf_counter() + self.spin_s
        while not status and time.perf_counter() < end:
            poll(device, False, null)

    def unmap(self, buffer) -> None:
        self._unmap(buffer._internal)


MAP_POLLS = 100
# Microseconds a readback polls without waiting before it blocks, on a GPU adapter (a software
# adapter computes on the CPU cores a spin would take from it: 0 there). ETWGPU_MAP_SPIN_US
# sets it for every adapter. H100, bench/readback_probe.py --floor: 8 KiB copied, submitted
# and read back in 50.8 us min (54.1 median) spinning against 60.5 (80.7) blocking at once,
# and the Llama-shaped layer's T=1 execute in 270.9 us min (280.3) against 314.0 (329.0).
MAP_SPIN_US = 1000.0


def map_spin_s(software: bool) -> float:
    env = os.environ.get("ETWGPU_MAP_SPIN_US")
    if env is not None:
        return float(env) * 1e-6
    return 0.0 if software else MAP_SPIN_US * 1e-6


def native_map(device, software: bool = False):
    """NativeMap, or None when wgpu-py's native backend does not expose its calls or
    ETWGPU_CHECKED_ENCODE=1 asks for wgpu-py's own calls."""
    if os.environ.get("ETWGPU_CHECKED_ENCODE") == "1":
        return None
    try:
        native = NativeMap(device)
    except (ImportError, AttributeError):   # another wgpu-py backend or layout
        return None
    native.spin_s = map_spin_s(software)
    return native


@dataclass
class GpuDevice:
    adapter: object
    device: object
    name: str
    has_f16: bool
    has_timestamps: bool
    limits: dict
    software: bool = False  # a CPU rasteriser: "auto" prefers the CPU executor over it
    has_subgroups: bool = False  # "subgroup" requested: WGSL subgroupAdd and subgroup builtins
    _modules: dict = field(default_factory=dict)
    _pipelines: dict = field(default_factory=dict)       # key -> _CachedPipeline in use
    _idle: OrderedDict = field(default_factory=OrderedDict)
    _layouts: dict = field(default_factory=dict)
    _native_map: object = None    # NativeMap, or None for wgpu-py's map_sync

    @property
    def queue(self):
        return self.device.queue

    # ---- pipelines -----------------------------------------------------------------------
    def acquire_pipeline(self, source: str, entry: str, constants: tuple, kinds: tuple):
        """(key, pipeline, bind group layout); release(key) when done with it."""
        key = (source, entry, constants, kinds)
        entry_ = self._pipelines.get(key) or self._idle.pop(key, None)
        if entry_ is None:
            entry_ = self._create_pipeline(source, entry, constants, kinds)
        entry_.users += 1
        self._pipelines[key] = entry_
        return key, entry_.pipeline, entry_.layout

    def release_pipeline(self, key) -> None:
        entry = self._pipelines.get(key)
        if entry is None:
            return
        entry.users -= 1
        if entry.users == 0:
            del self._pipelines[key]
            self._idle[key] = entry
            while len(self._idle) > IDLE_PIPELINES:
                self._idle.popitem(last=False)

    # ---- readback ------------------------------------------------------------------------
    def map_read(self, buffer, nbytes: int):
        """The first nbytes of a MAP_READ buffer that the last submit wrote, mapped: a buffer
        to copy from before unmap_read(buffer). READ_NOSYNC skips wgpu-py's first-map
        workaround, an empty submit so that a never-written buffer reads back."""
        if self._native_map is not None:
            return self._native_map.map(buffer, nbytes)
        buffer.map_sync("READ_NOSYNC", 0, nbytes)
        return buffer.read_mapped(0, nbytes, copy=False)

    def unmap_read(self, buffer) -> None:
        if self._native_map is not None:
            self._native_map.unmap(buffer)
        else:
            buffer.unmap()

    def copy_mapped(self, t: torch.Tensor, offset: int) -> bool:
        """Copy the mapped bytes from offset into contiguous tensor t (the dtype's bytes as
        they are); False, copying nothing, when the native calls are off."""
        if self._native_map is None:
            return False
        self._native_map.copy_out(t.data_ptr(), offset, t.numel() * t.element_size())
        return True

    def write_tensor(self, buffer, t: torch.Tensor) -> None:
        """Queue contiguous tensor t's bytes into the start of buffer."""
        if self._native_map is not None:
            self._native_map.write(buffer, t.data_ptr(), t.numel() * t.element_size())
        else:
            self.queue.write_buffer(buffer, 0, t.numpy())

    def pipeline_count(self) -> int:
        return len(self._pipelines) + len(self._idle)

    def _create_pipeline(self, source: str, entry: str, constants: tuple, kinds: tuple):
        import wgpu

        layout = self._bind_group_layout(kinds)
        try:
            module = self._modules.get(source)
            if module is None:
                module = self.device.create_shader_module(code=source)
                self._modules[source] = module
            pipeline = self.device.create_compute_pipeline(
                layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": entry, "constants": dict(constants)},
            )
        except wgpu.GPUError as e:  # wgpu-py raises the device's validation error right here
            raise ShaderError(f"WGSL entry {entry!r}: expected a valid shader and pipeline, "
                              f"got the driver's error:\n{e.message}") from None
        return _CachedPipeline(pipeline, layout)

    def _bind_group_layout(self, kinds: tuple):
        """kinds: per binding "uniform" | "read" | "rw" (binding i = kinds[i])."""
        import wgpu

        if kinds not in self._layouts:
            types = {"uniform": wgpu.BufferBindingType.uniform,
                     "read": wgpu.BufferBindingType.read_only_storage,
                     "rw": wgpu.BufferBindingType.storage}
            entries = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": types[k]}} for i, k in enumerate(kinds)]
            self._layouts[kinds] = self.device.create_bind_group_layout(entries=entries)
        return self._layouts[kinds]


def get_device(selector: str | None = None) -> GpuDevice:
    """The process-wide device for `selector` (default $ETWGPU_ADAPTER); DeviceError if none."""
    selector = adapter_selector() if selector is None else selector.strip()
    if selector not in _DEVICES:
        _DEVICES[selector] = _open(pick_adapter(selector))
    return _DEVICES[selector]


def adapter_unavailable(selector: str | None = None) -> str:
    """Empty when a WebGPU device can be had, else why not."""
    try:
        get_device(selector)
    except DeviceError as e:
        return str(e)
    return ""


def _open(adapter) -> GpuDevice:
    features = [f for f in OPTIONAL_FEATURES if f in adapter.features]
    offered = adapter.limits
    limits = {k: offered[k] for k in RAISED_LIMITS if k in offered}
    try:
        device = adapter.request_device_sync(required_features=features, required_limits=limits)
    except Exception as e:
        raise DeviceError(f"WebGPU device on {_describe_adapter(adapter)}: expected one, "
                          f"got {type(e).__name__}: {e}") from e
    software = software_adapter(adapter)
    gpu = GpuDevice(adapter, device, _describe_adapter(adapter), "shader-f16" in features,
                    "timestamp-query" in features, dict(device.limits), software,
                    has_subgroups="subgroup" in features,
                    _native_map=native_map(device, software))
    log.info("etwgpu: webgpu adapter %s; features %s; max buffer %d MiB, binding %d MiB",
             gpu.name, features or "none", limits.get("max-buffer-size", 0) >> 20,
             limits.get("max-storage-buffer-binding-size", 0) >> 20)
    return gpu

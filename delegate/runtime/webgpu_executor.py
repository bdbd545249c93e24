"""The WebGPU executor: runs a decoded IR graph as WGSL dispatches on the process-wide device.

Built once per load (the wgpu-py compute path, once): weights uploaded to their own buffers,
every activation assigned a storage buffer sized for its upper-bound shape and reused by
liveness, pipelines taken from the device's cache, one params uniform and one bind group per
dispatch, and a flat list of dispatches in node order. Each execute infers live shapes through
the op registry (as the CPU executor does), writes the inputs and any params that changed,
encodes every dispatch in one command encoder, submits once and maps the outputs back.

Everything on the GPU holds 4-byte elements: float32 as is, int32/int64 indices as i32 and bools
as u32 0/1, converted on the host when uploaded and when read back.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

import kernels_wgsl
from delegate import ops as registry
from delegate import symexpr
from delegate.errors import DelegateError, DeviceError, InputError, UnsupportedError
from delegate.ir import Graph, TensorValue
from delegate.runtime import planner, shapes
from kernels_wgsl.device import get_device

# torch dtype -> (dtype held on the GPU, dtype handed back)
_GPU_DTYPES = {torch.float32: torch.float32, torch.int32: torch.int32,
               torch.int64: torch.int32, torch.bool: torch.int32}
ELEMENT_BYTES = 4
MIN_BUFFER = 16


@dataclass
class BoundDispatch:
    op: str
    spec: kernels_wgsl.Dispatch
    pipeline: object
    bind_group: object
    uniform: object
    reads: tuple          # buffer slot ids read (for the ordering and aliasing checks)
    writes: tuple         # buffer slot ids written
    params: bytes = b""   # last bytes written to the uniform


@dataclass
class Step:
    op: str
    infer: object
    inputs: list
    outputs: list
    attrs: dict
    symbolic: bool
    dispatches: list = field(default_factory=list)


@dataclass
class Slot:
    """One storage buffer and what it holds."""
    buffer: object
    nbytes: int
    values: list


class WebGpuExecutor:
    device = "webgpu"

    def __init__(self, graph: Graph, weights: dict, adapter: str | None = None):
        """adapter: picks the adapter by name or backend (default: $ETWGPU_ADAPTER, else the
        high-performance one)."""
        self.graph = graph
        self._gpu = get_device(adapter)
        self._buffers: list = []      # every GPUBuffer this load created; destroyed in destroy()
        self._pipeline_keys: list = []
        self._steps: list = []
        try:
            self._build(weights)
        except BaseException:
            self.destroy()
            raise

    # ---- build -----------------------------------------------------------------------------
    def _build(self, weights: dict) -> None:
        nodes = self.graph.nodes   # folded ops (size queries, ...) emit no IR node
        kernels = [kernels_wgsl.get_kernel(n.op) for n in nodes]
        self._root = _alias_roots(nodes, kernels)
        self._loc: dict = {}          # value id -> slot id (activations) or weight buffer
        self._upload_weights(weights)
        self._plan_slots()
        self._dummy, self._dummy_rw = self._new_buffer(MIN_BUFFER), self._new_buffer(MIN_BUFFER)
        env = _max_env(self.graph)
        for node, kernel in zip(nodes, kernels):
            self._steps.append(self._build_step(node, kernel, env))
        self._readback, self._out_offsets = self._readback_buffer()

    def _new_buffer(self, nbytes: int, usage=None, data=None):
        import wgpu

        usage = usage or (wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
                          | wgpu.BufferUsage.COPY_DST)
        if data is not None:
            buf = self._gpu.device.create_buffer_with_data(data=data, usage=usage)
        else:
            buf = self._gpu.device.create_buffer(size=max(MIN_BUFFER, _align4(nbytes)), usage=usage)
        self._buffers.append(buf)
        return buf

    def _upload_weights(self, weights: dict) -> None:
        self._weights: dict = {}      # constant key -> GPUBuffer
        limit = self._gpu.limits["max-storage-buffer-binding-size"]
        for vid, v in enumerate(self.graph.values):
            if not (isinstance(v, TensorValue) and v.constant_key):
                continue
            if v.constant_key not in self._weights:
                host = _to_gpu_dtype(weights[v.constant_key], f"weight {v.constant_key}").contiguous()
                _check_binding(host.numel() * ELEMENT_BYTES, limit, f"weight {v.constant_key}")
                data = host.reshape(-1).view(torch.uint8).numpy().tobytes()
                data += bytes(max(0, MIN_BUFFER - len(data)))  # wgpu refuses empty buffers
                self._weights[v.constant_key] = self._new_buffer(0, data=data)
            self._loc[vid] = ("weight", v.constant_key)
        for vid, root in self._root.items():
            if root in self._loc:
                self._loc[vid] = self._loc[root]

    def _plan_slots(self) -> None:
        """Greedy interval colouring: largest values first, each into the first buffer none of
        whose values is live at the same time; a view shares its base's buffer and life."""
        lives = planner.lifetimes(self.graph)
        for vid, root in self._root.items():
            if vid in lives and root in lives:
                a, b = lives.pop(vid), lives[root]
                lives[root] = planner.Interval(min(a.first, b.first), max(a.last, b.last))
            lives.pop(vid, None)
        sizes = {vid: _capacity(self.graph.values[vid]) for vid in lives}
        limit = self._gpu.limits["max-storage-buffer-binding-size"]
        self._slots: list = []
        self._lives = lives
        for vid in sorted(sizes, key=lambda v: (-sizes[v], v)):
            _check_binding(sizes[vid], limit, f"value {vid}")
            free = [i for i, s in enumerate(self._slots)
                    if not any(lives[u].overlaps(lives[vid]) for u in s.values)]
            if free:
                self._slots[free[0]].values.append(vid)
            else:
                self._slots.append(Slot(None, sizes[vid], [vid]))
            self._loc[vid] = ("slot", free[0] if free else len(self._slots) - 1)
        for s in self._slots:
            s.buffer = self._new_buffer(s.nbytes)
        for vid, root in self._root.items():
            self._loc.setdefault(vid, self._loc.get(root))

    def _buffer_of(self, vid: int):
        if vid == -1:
            return self._dummy
        kind, key = self._loc[vid]
        return self._weights[key] if kind == "weight" else self._slots[key].buffer

    def _slot_of(self, vid: int):
        if vid == -1 or self._loc[vid][0] != "slot":
            return None
        return self._loc[vid][1]

    def _build_step(self, node, kernel, env: dict) -> Step:
        op = registry.get_op(node.op)
        step = Step(node.op, op.infer, node.inputs, node.outputs, node.attrs,
                    shapes.has_symbols(node.attrs))
        if kernel.alias:
            return step
        attrs = symexpr.resolve(node.attrs, env) if step.symbolic else node.attrs
        ins = [None if v == -1 else self.graph.values[v].max_shape for v in node.inputs]
        outs = [self.graph.values[v].max_shape for v in node.outputs]
        operands = list(node.inputs) + list(node.outputs)
        dtypes = tuple(None if v == -1 else self.graph.values[v].dtype for v in node.inputs)
        for spec in kernel.build(ins, outs, attrs, kernels_wgsl.BuildInfo(self._gpu, dtypes)):
            step.dispatches.append(self._bind(node.op, spec, operands, ins, outs, attrs))
        return step

    def _bind(self, op, spec, operands, ins, outs, attrs) -> BoundDispatch:
        import wgpu

        key, pipeline, layout = self._gpu.acquire_pipeline(
            kernels_wgsl.source(spec.shader, spec.prelude), spec.entry, spec.constants, spec.kinds())
        self._pipeline_keys.append(key)
        params, _ = spec.sizes(ins, outs, attrs)
        uniform = self._new_buffer(
            len(params), usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        ids = [-1 if a is None else operands[a] for a in spec.args]   # None: an unused binding
        # unused bindings get a dummy; a written one its own, as read and write usages conflict
        buffers = [uniform] + [self._dummy_rw if a is None and a in spec.writes
                               else self._buffer_of(v) for a, v in zip(spec.args, ids)]
        entries = [{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                   for i, b in enumerate(buffers)]
        bind_group = self._gpu.device.create_bind_group(layout=layout, entries=entries)
        slots = [(a, self._slot_of(v)) for a, v in zip(spec.args, ids)]
        reads = tuple(s for a, s in slots if s is not None and a not in spec.writes)
        writes = tuple(s for a, s in slots if s is not None and a in spec.writes)
        return BoundDispatch(op, spec, pipeline, bind_group, uniform, reads, writes)

    def _readback_buffer(self):
        import wgpu

        offsets, total = [], 0
        for vid in self.graph.outputs:
            offsets.append(total)
            total += _capacity(self.graph.values[vid])
        usage = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        return self._new_buffer(total, usage=usage), offsets

    # ---- execute ---------------------------------------------------------------------------
    def execute(self, inputs: list) -> list:
        plan, live = self._prepare(inputs)
        encoder = self._gpu.device.create_command_encoder()
        self._encode(encoder.begin_compute_pass(), plan)
        return self._finish(encoder, live)

    def execute_profiled(self, inputs: list) -> tuple:
        """(outputs, [("entry [op]", seconds)], clock): each dispatch in its own compute pass,
        timed by GPU timestamp queries ("gpu") or, without them, by waiting on each ("wall")."""
        plan, live = self._prepare(inputs)
        labels = [f"{b.spec.entry} [{b.op}]" for b, _ in plan]
        if not self._gpu.has_timestamps:
            return self._wall_profiled(plan, live, labels)
        import wgpu

        device = self._gpu.device
        queries = device.create_query_set(type="timestamp", count=max(2, 2 * len(plan)))
        stamps = device.create_buffer(size=max(16, 16 * len(plan)),
                                      usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        try:
            encoder = device.create_command_encoder()
            for i, (bound, grid) in enumerate(plan):
                writes = {"query_set": queries, "beginning_of_pass_write_index": 2 * i,
                          "end_of_pass_write_index": 2 * i + 1}
                self._encode(encoder.begin_compute_pass(timestamp_writes=writes), [(bound, grid)])
            if plan:
                encoder.resolve_query_set(queries, 0, 2 * len(plan), stamps, 0)
            outs = self._finish(encoder, live)
            ticks = torch.frombuffer(bytearray(self._gpu.queue.read_buffer(stamps)), dtype=torch.int64)
        finally:
            queries.destroy()
            stamps.destroy()
        # WebGPU timestamps are nanoseconds
        times = [(lab, float(ticks[2 * i + 1] - ticks[2 * i]) * 1e-9) for i, lab in enumerate(labels)]
        return outs, times, "gpu"

    def _wall_profiled(self, plan, live, labels) -> tuple:
        import time

        times = []
        for (bound, grid), label in zip(plan, labels):
            encoder = self._gpu.device.create_command_encoder()
            self._encode(encoder.begin_compute_pass(), [(bound, grid)])
            t0 = time.perf_counter()
            self._gpu.queue.submit([encoder.finish()])
            self._gpu.queue.read_buffer(self._dummy)   # waits for the submission to finish
            times.append((label, time.perf_counter() - t0))
        return self._finish(self._gpu.device.create_command_encoder(), live), times, "wall"

    @staticmethod
    def _encode(compute, plan) -> None:
        for bound, grid in plan:
            compute.set_pipeline(bound.pipeline)
            compute.set_bind_group(0, bound.bind_group)
            compute.dispatch_workgroups(*grid)
        compute.end()

    def _prepare(self, inputs: list):
        """Bind and upload the inputs, infer live shapes, write changed params.

        Returns ([(dispatch, grid)], {value id: live shape})."""
        env = shapes.bind_inputs(self.graph, inputs)
        live = {vid: self.graph.values[vid].max_shape for vid, loc in self._loc.items()
                if loc and loc[0] == "weight"}
        queue = self._gpu.queue
        for vid, t in zip(self.graph.inputs, inputs):
            if isinstance(self.graph.values[vid], TensorValue):
                live[vid] = tuple(t.shape)
                host = _to_gpu_dtype(t, f"input value {vid}").contiguous()
                if host.numel():
                    queue.write_buffer(self._buffer_of(vid), 0, host.reshape(-1).view(torch.uint8).numpy())
        plan = []
        for st in self._steps:
            plan.extend(self._plan_step(st, env, live))
        return plan, live

    def _plan_step(self, st: Step, env: dict, live: dict) -> list:
        attrs = symexpr.resolve(st.attrs, env) if st.symbolic else st.attrs
        ins = [None if v == -1 else live[v] for v in st.inputs]
        outs = [tuple(s) for s in st.infer(ins, attrs)]
        for vid, shape in zip(st.outputs, outs):
            want = shapes.live_shape(self.graph.values[vid], env)
            if shape != want:
                raise DelegateError(f"{st.op} output shape: expected {want} (from export), got {shape}")
            live[vid] = shape
        plan = []
        for bound in st.dispatches:
            params, count = bound.spec.sizes(ins, outs, attrs)
            if count == 0:
                continue
            if params != bound.params:
                self._gpu.queue.write_buffer(bound.uniform, 0, params)
                bound.params = params
            plan.append((bound, self._fold(count)))
        return plan

    def _fold(self, count: int) -> tuple:
        """Workgroup count -> (x, y) within the per-dimension limit; kernels use wg_linear()."""
        most = self._gpu.limits["max-compute-workgroups-per-dimension"]
        if count <= most:
            return (count, 1)
        y = -(-count // most)
        return (-(-count // y), y)

    def _finish(self, encoder, live: dict) -> list:
        import wgpu

        sizes = []
        for vid, off in zip(self.graph.outputs, self._out_offsets):
            nbytes = kernels_wgsl.numel(live[vid]) * ELEMENT_BYTES
            if nbytes:
                encoder.copy_buffer_to_buffer(self._buffer_of(vid), 0, self._readback, off, nbytes)
            sizes.append(nbytes)
        self._gpu.queue.submit([encoder.finish()])
        self._readback.map_sync(wgpu.MapMode.READ)
        try:
            raw = bytearray(self._readback.read_mapped())
        finally:
            self._readback.unmap()
        outs = []
        for vid, off, nbytes in zip(self.graph.outputs, self._out_offsets, sizes):
            spec = self.graph.values[vid]
            t = torch.frombuffer(raw, dtype=_GPU_DTYPES[spec.dtype], count=nbytes // ELEMENT_BYTES,
                                 offset=off) if nbytes else torch.empty(0, dtype=_GPU_DTYPES[spec.dtype])
            outs.append(_from_gpu_dtype(t.clone().view(live[vid]), spec.dtype))
        return outs

    # ---- introspection and teardown ----------------------------------------------------------
    def dispatch_list(self) -> list:
        """[(op, kernel label, slots read, slots written, node output ids)] in submission order."""
        return [(st.op, b.spec.label or b.spec.entry, b.reads, b.writes, tuple(st.outputs))
                for st in self._steps for b in st.dispatches]

    def output_slots(self) -> list:
        """(value id whose bytes each graph output is, its buffer slot) per graph output."""
        return [(self._root.get(v, v), self._slot_of(v)) for v in self.graph.outputs]

    def describe(self) -> dict:
        return {"device": "webgpu", "adapter": self._gpu.name,
                "ops": [n.op for n in self.graph.nodes],
                "dispatches": sum(len(st.dispatches) for st in self._steps),
                "buffers": len(self._slots) if hasattr(self, "_slots") else 0,
                "activation_bytes": sum(s.nbytes for s in getattr(self, "_slots", [])),
                "weight_bytes": sum(b.size for b in getattr(self, "_weights", {}).values()),
                "shader_f16": self._gpu.has_f16, "timestamps": self._gpu.has_timestamps}

    def destroy(self) -> None:
        """Free every buffer, bind group and uniform of this load and release its pipelines."""
        for buf in self._buffers:
            buf.destroy()
        self._buffers = []
        for key in self._pipeline_keys:
            self._gpu.release_pipeline(key)
        self._pipeline_keys = []
        self._steps = []
        self._slots, self._weights, self._loc = [], {}, {}
        self._readback = self._dummy = self._dummy_rw = None


# ---- helpers ----------------------------------------------------------------------------------
def _alias_roots(nodes, kernels) -> dict:
    """value id -> the value whose bytes it reinterprets, for outputs of alias (view) kernels."""
    root = {}
    for node, kernel in zip(nodes, kernels):
        if kernel.alias:
            src = node.inputs[0]
            root[node.outputs[0]] = root.get(src, src)
    return root


def _max_env(graph: Graph) -> dict:
    return {s.name: graph.values[graph.inputs[s.input]].max_shape[s.dim] for s in graph.symbols}


def _capacity(spec: TensorValue) -> int:
    if spec.dtype not in _GPU_DTYPES:
        raise UnsupportedError(f"tensor dtype on WebGPU: expected one of "
                               f"{[str(d) for d in _GPU_DTYPES]}, got {spec.dtype}")
    return kernels_wgsl.numel(spec.max_shape) * ELEMENT_BYTES


def _check_binding(nbytes: int, limit: int, what: str) -> None:
    if nbytes > limit:
        raise DeviceError(f"{what}: expected at most {limit} bytes per storage binding on this "
                          f"adapter, got {nbytes}")


def _to_gpu_dtype(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.dtype not in _GPU_DTYPES:
        raise InputError(f"{what} dtype on WebGPU: expected one of "
                         f"{[str(d) for d in _GPU_DTYPES]}, got {t.dtype}")
    return t.to(_GPU_DTYPES[t.dtype])


def _from_gpu_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t != 0 if dtype == torch.bool else t.to(dtype)


def _align4(n: int) -> int:
    return (int(n) + 3) // 4 * 4

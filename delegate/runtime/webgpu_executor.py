"""The WebGPU executor: runs a decoded IR graph as WGSL dispatches on the process-wide device.

Built once per load (the wgpu-py compute path, once): weights uploaded to their own buffers,
every activation assigned a storage buffer sized for its upper-bound shape and reused by
liveness, pipelines taken from the device's cache, one params uniform and one bind group per
dispatch (slices of one params buffer), and a flat list of dispatches in node order. The first
execute of each shape binding builds that binding's replay through the graph plan: the params
block of every dispatch, the grids, and where each live output lands in the readback buffer.
An execute then writes the inputs, uploads the params block only when the binding changed (one
write), encodes the prepared dispatches in one command encoder, submits once, and maps and
copies only the live output bytes, straight into the caller's output tensors.

Everything on the GPU holds 4-byte elements: float32 as is, int32/int64 indices as i32 and bools
as u32 0/1, converted on the host when uploaded and when read back.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch

import kernels_wgsl
from delegate import ops as registry
from delegate import symexpr
from delegate.errors import (BlobError, DelegateError, DeviceError, InputError, ProgramError,
                             UnsupportedError)
from delegate.ir import Graph, TensorValue
import kernels_cpu
from delegate.runtime import cpu_fallback, planner
from delegate.runtime.cpu_executor import scratch_bytes
from delegate.runtime.memory import allocate
from delegate.runtime.graph_plan import GraphPlan
from delegate.runtime.values import resize_within
from kernels_wgsl.device import get_device, raw_pass_calls

# torch dtype -> (dtype held on the GPU, dtype handed back)
_GPU_DTYPES = {torch.float32: torch.float32, torch.int32: torch.int32,
               torch.int64: torch.int32, torch.bool: torch.int32}
_SAME_ON_GPU = (torch.float32, torch.int32)   # uploaded as they are
_NP_DTYPES = {torch.float32: np.float32, torch.int32: np.int32, torch.int64: np.int32,
              torch.bool: np.int32}
ELEMENT_BYTES = 4
# A dispatch list this long goes out in several submits, so the GPU runs each piece while the
# next is encoded: a first short piece (the GPU starts early), then pieces of SUBMIT_EVERY.
# Measured on the H200 (Llama-shaped layer, 18 dispatches, T=1): one submit 395-446 µs, two
# 360-367 µs, four 363-379 µs. Llama-3.2-1B int4 decode (763 dispatches, bench/llama.py):
# pieces of 32: 120.8 tok/s, 64: 114.3, 128: 96.1, 256: 75.5, one piece: 83.6.
SPLIT_SUBMIT_MIN = 16
SUBMIT_EVERY = 32
# Encoding ahead: an execute encodes the pass calls of the next execute of its binding right
# after it submits, while the GPU runs, into encoders (its pieces) left unfinished; the next
# execute of that binding only finishes and submits them, a piece at a time so the GPU starts
# on the first. Unfinished, because wgpu-native 29 frees a dropped encoder but leaks a finished
# command buffer that is never submitted (about 90 KB each: 60,000 took RSS to 5.7 GB here),
# and a binding may not come back. H100, Llama-shaped layer (bench/overhead.py): T=1 wall
# 224.7 -> 199.5 µs, T=512 3559 -> 3492 µs. ETWGPU_ENCODE_AHEAD=0 turns it off.
# Finishing ahead: a binding executed twice in a row has its next execute's command buffers
# finished ahead too, so that execute only submits them: finish() is wgpu-native's
# validation, tracking and HAL encoding, ~5.5 us a dispatch on the H100 (27.5 us of the T=1
# layer's 200), all on the path before the GPU starts. Because a finished command buffer leaks
# unless it is submitted, only a binding whose grids no offset can move (no grid sites) holds
# them; they stay with it across other bindings' executes, at most HELD_BINDINGS of them, and
# destroy() submits whatever is still held, when nothing will read what those runs write.
# A step that reads an offset (ExecuTorch's Llama decode: the cache writes and sdpa at the
# host's input_pos) is a grid site unless its kernel declares the grid fixed at the binding's
# shapes (Dispatch.fixed_grid: strided copies; sdpa at decode L, whose splits cover the whole
# cache): then its grid is checked at every execute instead, and a move is a ProgramError,
# never a stale finished buffer run.
# H100, the T=1 layer's executor.execute, 4 alternated rounds of 300 in one run: min 193.1 ->
# 163.8 us, median 227.0 -> 185.9 (nothing ahead: 213.9, median 270.6).
# Held command buffers are two pieces, the first short one and the rest: no encoding is left
# to overlap, and fewer passes and submits cost less. H100, Llama-3.2-1B int4 decode (118
# dispatches), 4 alternated rounds, min: pieces [16, 102] 476.8 tok/s against [16, 32, 32,
# 32, 6] 459.9 (one submit each: 450.1) at context 128; 443.2 against 440.1 (420.2) at 1024.
HELD_BINDINGS = 4
ENCODE_AHEAD_ENV = "ETWGPU_ENCODE_AHEAD"
MIN_BUFFER = 16
PROFILE_MODES = ("each", "whole", "marginal", "dropped")   # execute_profiled's ways to time
REPLAYING_MODES = ("marginal", "dropped")   # modes that run dispatches more than once


@dataclass
class BoundDispatch:
    op: str
    spec: kernels_wgsl.Dispatch
    pipeline: object
    bind_group: object
    params_offset: int    # where its params live in the load's params buffer
    params_size: int
    reads: tuple          # buffer slot ids read (for the ordering and aliasing checks)
    writes: tuple         # buffer slot ids written
    raw: tuple = ()       # (pipeline, bind group) C handles for RawPassCalls, when offered


@dataclass
class Replay:
    """One binding's prepared dispatches."""
    dispatches: list      # [(BoundDispatch, grid)] in submission order
    params: bytes         # the whole params block of this binding
    reads: list           # [(output index, source buffer, readback offset, nbytes)]
    readback_bytes: int
    dynamic: list         # [(step index, BoundDispatch, key)] whose params follow offset
                          # symbols: first twins only (their twins share the params slots)
    grid_sites: dict      # key -> [(list, index)] of it and its twins in dispatches and parts
    parts: list           # dispatch lists and CpuRuns in node order ([dispatches] without any)
    fixed_grids: dict = field(default_factory=dict)   # key -> the grid a dynamic dispatch
                          # declared fixed (Dispatch.fixed_grid) has at every offset
    regrids: int = 0      # how often an offset moved a grid: an encoder encoded ahead holds
                          # the grids of the count it was encoded at


@dataclass
class Transfers:
    """Bytes moved between host and GPU: by the last execute and in all, so a test can
    assert that a decode step moves only the token, the params prefix and the logits."""
    uploads: int = 0              # write_buffer calls of the last execute
    upload_bytes: int = 0
    download_bytes: int = 0
    executes: int = 0
    total_upload_bytes: int = 0
    total_download_bytes: int = 0

    def begin(self) -> "Transfers":
        self.uploads = self.upload_bytes = self.download_bytes = 0
        self.executes += 1
        return self

    def upload(self, nbytes: int) -> None:
        self.uploads += 1
        self.upload_bytes += nbytes
        self.total_upload_bytes += nbytes

    def download(self, nbytes: int) -> None:
        self.download_bytes += nbytes
        self.total_download_bytes += nbytes


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
        self._raw = raw_pass_calls()
        self._buffers: list = []      # every GPUBuffer this load created; destroyed in destroy()
        self._pipeline_keys: list = []
        self._steps: list = []        # per IR node: its BoundDispatches
        self._params_now = None       # the binding whose params block was last uploaded
        self._prefix_now = b""        # and its offset-dependent prefix
        self.encode_ahead = os.environ.get(ENCODE_AHEAD_ENV, "1") != "0"
        self._ahead = None            # (binding, its regrids, [unfinished encoder per piece])
        self.ahead_submits = 0        # executes that submitted an encoder encoded ahead
        self._held: list = []         # [(binding, [finished command buffer per piece])]
        self._last = None             # the binding of the last execute
        self.finished_submits = 0     # executes that submitted command buffers finished ahead
        self._offsets_last = None     # (binding, offset values) of the last execute
        self._params_next = None      # (binding, offsets, (attrs, params prefix)) computed ahead
        self.params_ahead = True      # _predict_params on (a benchmark's A/B switch)
        self.params_ahead_hits = 0    # executes whose offset-dependent params were ready
        self.transfers = Transfers()
        try:
            self.plan = GraphPlan(graph, self._replay)
            self._build(weights)
        except BaseException:
            self.destroy()
            raise

    # ---- build -----------------------------------------------------------------------------
    def _build(self, weights: dict) -> None:
        nodes = self.graph.nodes   # folded ops (size queries, ...) emit no IR node
        kernels = [kernels_wgsl.get_kernel(n.op) if kernels_wgsl.has_kernel(n.op) else None
                   for n in nodes]
        self._plan_fallback(nodes, kernels, weights)
        self._root = _alias_roots(nodes, kernels)
        self._loc: dict = {}          # value id -> slot id (activations) or weight buffer
        self._upload_weights(weights)
        self._plan_slots()
        self._dummy, self._dummy_rw = self._new_buffer(MIN_BUFFER), self._new_buffer(MIN_BUFFER)
        env = self.plan.max_env()
        specs = [self._specs(node, kernel, env) for node, kernel in zip(nodes, kernels)]
        offsets = self._params_offsets(specs)
        self._params_buffer = self._params_layout()
        self._scratch = self._scratch_buffers(specs)
        for i, (node, step_specs) in enumerate(zip(nodes, specs)):
            self._steps.append([self._bind(node, spec, offsets[i, j], size)
                                for j, (spec, size) in enumerate(step_specs)])
        self._readback = self._readback_buffer()
        read = {v for n in nodes for v in n.inputs} | set(self.graph.outputs)
        read |= {u.value for u in self.graph.state_updates}
        # an input only a symbol reads (input_pos) is not uploaded
        self._uploaded_inputs = [(k, vid) for k, vid in enumerate(self.graph.inputs) if vid in read]

    def _params_offsets(self, specs: list) -> dict:
        """(step, dispatch) -> offset in the params buffer. Dispatches whose params follow an
        offset symbol come first, so a decode step rewrites one short prefix of the block.
        Twin steps (GraphPlan.twin: the same op, shapes and attributes, as in each layer of
        an LLM) share their first twin's slots; _replay checks that their params agree."""
        dynamic, twin = set(self.plan.dynamic_steps), self.plan.twin
        order = sorted(range(len(specs)), key=lambda i: i not in dynamic)
        offsets, offset = {}, 0
        self._dynamic_bytes = 0
        for i in order:
            if twin[i] != i and _same_dispatches(specs[i], specs[twin[i]]):
                offsets.update({(i, j): offsets[twin[i], j] for j in range(len(specs[i]))})
                continue
            for j, (spec, size) in enumerate(specs[i]):
                if j and spec.shared_params:
                    offsets[i, j] = offsets[i, j - 1]
                    continue
                offsets[i, j] = offset
                offset += self._params_stride(size)
            if i in dynamic:
                self._dynamic_bytes = offset
        self._params_bytes = offset
        return offsets

    def _plan_fallback(self, nodes, kernels, weights: dict) -> None:
        """Nodes with no WGSL kernel run on the CPU kernels (cpu_fallback): those kernels, the
        host copies of the weights they read, and their scratch."""
        self._cpu_kernels = {i: kernels_cpu.get_kernel(n.op)
                             for i, (n, k) in enumerate(zip(nodes, kernels)) if k is None}
        values = self.graph.values
        self._host_weights = {vid: weights[values[vid].constant_key]
                              for i in self._cpu_kernels for vid in nodes[i].inputs
                              if vid != -1 and getattr(values[vid], "constant_key", None)}
        self._cpu_scratch = allocate(scratch_bytes(self.plan, self._cpu_kernels),
                                     "CPU fallback scratch") if self._cpu_kernels else None
        self._staging = None

    def _specs(self, node, kernel, env: dict) -> list:
        """[(Dispatch, params bytes at the upper-bound shapes)] of one node."""
        if kernel is None or kernel.alias:   # a CPU node, or a view of its input's bytes
            return []
        attrs = symexpr.resolve(node.attrs, env)
        ins = [None if v == -1 else self.graph.values[v].max_shape for v in node.inputs]
        outs = [self.graph.values[v].max_shape for v in node.outputs]
        dtypes = tuple(None if v == -1 else self.graph.values[v].dtype for v in node.inputs)
        info = kernels_wgsl.BuildInfo(self._gpu, dtypes, scratch=True)
        try:
            specs = kernel.build(ins, outs, attrs, info)
            return [(spec, len(spec.sizes(ins, outs, attrs)[0])) for spec in specs]
        except DelegateError:
            raise
        except Exception as e:  # noqa: BLE001 - shapes our own lowering never writes
            raise BlobError(f"node {node.name or node.op}: expected shapes and attributes its "
                            f"WGSL kernel can be built for, got {type(e).__name__}: {e}") from e

    def _scratch_buffers(self, specs: list) -> list:
        """Scratch operand j of any dispatch binds buffer j, sized for the largest request:
        scratch lives only between one node's dispatches, so every node shares them."""
        sizes: list = []
        for step in specs:
            for spec, _ in step:
                for j, n in enumerate(spec.scratch):
                    sizes[j:j + 1] = [max(sizes[j] if j < len(sizes) else 0, int(n))]
        limit = self._gpu.limits["max-storage-buffer-binding-size"]
        for j, n in enumerate(sizes):
            _check_binding(n, limit, f"scratch {j}")
        return [self._new_buffer(n) for n in sizes]

    def _params_stride(self, size: int) -> int:
        align = self._gpu.limits.get("min-uniform-buffer-offset-alignment", 256)
        return -(-max(size, 16) // align) * align

    def _params_layout(self):
        """One uniform buffer holding every params slot (_params_offsets), each aligned."""
        import wgpu

        return self._new_buffer(max(self._params_bytes, MIN_BUFFER),
                                usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)

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
            if not (isinstance(v, TensorValue) and v.constant_key) or v.state:
                continue
            if v.constant_key not in self._weights:
                self._weights[v.constant_key] = self._filled_buffer(
                    weights[v.constant_key], limit, f"weight {v.constant_key}")
            self._loc[vid] = ("weight", v.constant_key)
        self._upload_states(weights, limit)
        for vid, root in self._root.items():
            if root in self._loc:
                self._loc[vid] = self._loc[root]

    def _upload_states(self, weights: dict, limit: int) -> None:
        """Each state gets a buffer of its own (two states may start from the same bytes),
        holding its initial value; it stays resident across executes until destroy()."""
        self._states: dict = {}       # state value id -> GPUBuffer
        for vid, v in enumerate(self.graph.values):
            if isinstance(v, TensorValue) and v.state:
                self._states[vid] = self._filled_buffer(weights[v.constant_key], limit,
                                                        f"state {vid}")
                self._loc[vid] = ("state", vid)
        self._state_copies = [(u.value, u.state) for u in self.graph.state_updates
                              if self._root.get(u.value, u.value) != u.state]

    def _filled_buffer(self, t: torch.Tensor, limit: int, what: str):
        """A storage buffer holding t's elements as the GPU holds them (4 bytes each)."""
        host = _to_gpu_dtype(t, what, UnsupportedError).contiguous()
        _check_binding(host.numel() * ELEMENT_BYTES, limit, what)
        data = host.reshape(-1).view(torch.uint8).numpy().tobytes()
        data += bytes(max(0, MIN_BUFFER - len(data)))  # wgpu refuses empty buffers
        return self._new_buffer(0, data=data)

    def _plan_slots(self) -> None:
        """Greedy interval colouring: largest values first, each into the first buffer none of
        whose values is live at the same time; a view shares its base's buffer and life."""
        lives = planner.shared_lifetimes(self.graph, self._root)
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
        if kind == "slot":
            return self._slots[key].buffer
        return self._weights[key] if kind == "weight" else self._states[key]

    def _slot_of(self, vid: int):
        if vid == -1 or self._loc[vid][0] != "slot":
            return None
        return self._loc[vid][1]

    def _bind(self, node, spec, offset: int, size: int) -> BoundDispatch:
        key, pipeline, layout = self._gpu.acquire_pipeline(
            kernels_wgsl.source(spec.shader, spec.prelude), spec.entry, spec.constants, spec.kinds())
        self._pipeline_keys.append(key)
        operands = list(node.inputs) + list(node.outputs)
        n = len(operands)
        # None: an unused binding; past the outputs: a scratch operand
        ids = [-1 if a is None or a >= n else operands[a] for a in spec.args]
        # unused bindings get a dummy; a written one its own, as read and write usages conflict
        buffers = [self._scratch[a - n] if a is not None and a >= n
                   else self._dummy_rw if a is None and a in spec.writes
                   else self._buffer_of(v) for a, v in zip(spec.args, ids)]
        entries = [{"binding": 0, "resource": {"buffer": self._params_buffer, "offset": offset,
                                               "size": max(size, 16)}}]
        entries += [{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                    for i, b in enumerate(buffers, start=1)]
        bind_group = self._gpu.device.create_bind_group(layout=layout, entries=entries)
        slots = [(a, self._slot_of(v)) for a, v in zip(spec.args, ids)]
        reads = tuple(s for a, s in slots if s is not None and a not in spec.writes)
        writes = tuple(s for a, s in slots if s is not None and a in spec.writes)
        raw = (self._raw.handle(pipeline), self._raw.handle(bind_group)) if self._raw else ()
        return BoundDispatch(node.op, spec, pipeline, bind_group, offset, size, reads, writes,
                             raw)

    def _readback_buffer(self):
        import wgpu

        total = sum(_capacity(self.graph.values[vid]) for vid in self.graph.outputs)
        usage = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        return self._new_buffer(total, usage=usage)

    # ---- per binding -----------------------------------------------------------------------
    def _replay(self, b) -> Replay:
        block = bytearray(self._params_buffer.size)
        plan, dynamic, parts, cpu_steps, host, written = [], [], [[]], [], {}, set()
        sites, fixed = {}, {}   # an offset can change a grid too (see _regrid), unless fixed
        for st, attrs, bound in zip(self.plan.steps, b.attrs, self._steps):
            if st.index in self._cpu_kernels:
                cpu_steps.append(st)
                continue
            if cpu_steps:   # a run of CPU nodes ends here
                parts += [cpu_fallback.build_run(self, cpu_steps, b, host), []]
                cpu_steps = []
            ins = [None if v == -1 else b.live[v] for v in st.inputs]
            outs = [b.live[v] for v in st.outputs]
            root, moving = self.plan.twin[st.index], st.index in self.plan.dynamic_steps
            for j, d in enumerate(bound):
                grid = self._write_params(d, block, ins, outs, attrs, st, written)
                if moving:
                    key = (root, j)
                    if root == st.index:
                        dynamic.append((st.index, d, key))
                    if _declared_fixed(d, ins, attrs):
                        fixed[key] = grid or (0, 0)
                    else:   # kept even when skipped now: a later offset may run it
                        grid = grid or (0, 0)
                        sites.setdefault(key, []).extend([(plan, len(plan)),
                                                          (parts[-1], len(parts[-1]))])
                if grid is not None:
                    plan.append((d, grid))
                    parts[-1].append((d, grid))
        if cpu_steps:
            parts += [cpu_fallback.build_run(self, cpu_steps, b, host), []]
        self._size_staging(parts)
        reads, offset = [], 0
        for j, vid in enumerate(self.graph.outputs):
            size = kernels_wgsl.numel(b.live[vid]) * ELEMENT_BYTES
            reads.append((j, self._buffer_of(vid), offset, size))
            offset += size
        return Replay(plan, bytes(block), reads, offset, dynamic, sites, parts, fixed_grids=fixed)

    def _size_staging(self, parts: list) -> None:
        need = max((p.staging_bytes for p in parts if isinstance(p, cpu_fallback.CpuRun)),
                   default=0)
        if need and (self._staging is None or self._staging.size < need):
            self._staging = cpu_fallback.staging_buffer(self, max(need, MIN_BUFFER))

    def _write_params(self, d: BoundDispatch, block, ins, outs, attrs, st, written=None):
        """Pack one dispatch's params into the block; its grid, or None when it is skipped.
        `written`: the slots packed so far this binding; a shared slot must get equal bytes."""
        try:
            params, count = d.spec.sizes(ins, outs, attrs)
        except DelegateError:
            raise
        except Exception as e:  # noqa: BLE001 - as in _specs
            raise BlobError(f"{st.where()} {d.spec.entry}: expected shapes its params can be "
                            f"packed for, got {type(e).__name__}: {e}") from e
        if len(params) > d.params_size:
            raise DelegateError(f"{st.where()} {d.spec.entry} params: expected at most "
                                f"{d.params_size} bytes (upper-bound shapes), got {len(params)}")
        at = slice(d.params_offset, d.params_offset + len(params))
        if written is not None and d.params_offset in written and block[at] != params:
            raise BlobError(f"{st.where()} {d.spec.entry} params: expected the bytes of the "
                            f"twin step whose slot it shares, got others")
        block[at] = params
        if written is not None:
            written.add(d.params_offset)
        return self._fold(count) if count else None

    # ---- execute ---------------------------------------------------------------------------
    def execute(self, inputs: list, outputs: list | None = None) -> list:
        """Run the graph; `outputs` as for CpuExecutor.execute."""
        b = self.plan.binding_for(inputs)
        offsets = self.plan.offset_env(inputs)
        attrs_now = self._upload(b, inputs, offsets)
        ahead, self._ahead = self._ahead, None
        held = self._take_held(b)
        if held is not None:
            for command_buffer in held:
                self._gpu.queue.submit([command_buffer])
            self.ahead_submits += 1
            self.finished_submits += 1
        elif ahead is not None and ahead[:2] == (b, b.payload.regrids):
            for encoder in ahead[2]:
                self._gpu.queue.submit([encoder.finish()])
            self.ahead_submits += 1
        else:
            self._encode_and_submit(b, inputs, attrs_now)
        if self.encode_ahead and len(b.payload.parts) == 1:   # no CPU fallback between
            self._encode_next(b)
        self._predict_params(b, offsets)
        self._last = b
        return self._read(b, outputs)

    def _take_held(self, b):
        """The command buffers finished ahead for b's key, taken out of the held list, or None:
        a binding the plan cache evicted and built again has the same bind ranges and params."""
        for i, (binding, command_buffers) in enumerate(self._held):
            if binding.key == b.key:
                del self._held[i]
                return command_buffers
        return None

    def _encode_next(self, b) -> None:
        """Encode b's next execute while the GPU runs this one: finished and held when b ran
        twice in a row and may hold them (HELD_BINDINGS), else left unfinished in _ahead.
        Held, it is two pieces, the first short one and the rest: nothing is left to encode
        or finish between their submits, and each piece costs a compute pass and a submit
        of its own (measured above HELD_BINDINGS; why a pass costs is not measured)."""
        if b is self._last and not b.payload.grid_sites and len(self._held) < HELD_BINDINGS:
            encoders = self._encode_pieces(b, held=True)
            self._held.append((b, [encoder.finish() for encoder in encoders]))
        else:
            self._ahead = (b, b.payload.regrids, self._encode_pieces(b))

    def _submit_held(self) -> None:
        """Submit every held command buffer, each binding's params first, so that none is
        dropped unsubmitted (wgpu-native would leak it); for destroy(), which frees what they
        write before anything reads it."""
        for b, command_buffers in self._held:
            self._gpu.queue.write_buffer(self._params_buffer, 0, b.payload.params)
            for command_buffer in command_buffers:
                self._gpu.queue.submit([command_buffer])
        self._held = []
        self._params_now = None

    def _encode_pieces(self, b, held: bool = False) -> list:
        """b's dispatches, an encoder per piece (_pieces; held: its first piece, then the
        rest as one), the last with the copies; each left unfinished."""
        part, encoders = b.payload.parts[0], []
        for piece in _pieces(part, len(part) if held else None):
            encoders.append(self._gpu.device.create_command_encoder())
            self._encode(encoders[-1].begin_compute_pass(), piece)
        self._encode_copies(encoders[-1], b)
        return encoders

    def _encode_and_submit(self, b, inputs: list, attrs_now: dict) -> None:
        """Encode b's parts and submit them: a long dispatch list in pieces, each submitted as
        soon as it is encoded so the GPU starts on it, with CPU fallback runs between."""
        encoder = self._gpu.device.create_command_encoder()
        for part in b.payload.parts:
            if not isinstance(part, list):   # nodes with no WGSL kernel: run them on the CPU
                encoder = cpu_fallback.run(self, part, encoder, inputs, attrs_now)
                continue
            *early, last = _pieces(part)
            for piece in early:   # the GPU runs these while the rest is encoded
                self._encode(encoder.begin_compute_pass(), piece)
                self._gpu.queue.submit([encoder.finish()])
                encoder = self._gpu.device.create_command_encoder()
            self._encode(encoder.begin_compute_pass(), last)
        self._encode_copies(encoder, b)
        self._gpu.queue.submit([encoder.finish()])

    def _upload(self, b, inputs: list, offsets: dict | None = None) -> dict:
        """The inputs nodes read, and the params: the whole block when the binding changed,
        else only the prefix of offset-dependent params when an offset moved. Returns the
        offset-dependent steps' attributes at this execute (`offsets`: offset_env's, read
        here when not given)."""
        if offsets is None:
            offsets = self.plan.offset_env(inputs)
        queue, moved = self._gpu.queue, self.transfers.begin()
        for k, vid in self._uploaded_inputs:
            t = inputs[k]
            if isinstance(t, torch.Tensor) and t.numel():
                host = t if t.dtype in _SAME_ON_GPU else _to_gpu_dtype(t, f"input value {vid}")
                host = host.contiguous()
                self._gpu.write_tensor(self._buffer_of(vid), host)
                moved.upload(host.numel() * ELEMENT_BYTES)
        r = b.payload
        attrs_now, prefix = self._offset_params(b, offsets)
        if self._params_now is not b:
            block = prefix + r.params[len(prefix):]
            queue.write_buffer(self._params_buffer, 0, block)
            moved.upload(len(block))
            self._params_now, self._prefix_now = b, prefix
        elif prefix != self._prefix_now:
            queue.write_buffer(self._params_buffer, 0, prefix)
            moved.upload(len(prefix))
            self._prefix_now = prefix
        return attrs_now

    def _offset_params(self, b, offsets: dict) -> tuple:
        """(the offset-dependent steps' attributes, the params prefix) at `offsets`: the ones
        _predict_params computed while the GPU ran the last execute when it guessed these
        offsets, else computed now (the same calls, so the same values and checks)."""
        ready, self._params_next = self._params_next, None
        if ready is not None and ready[0] is b and ready[1] == offsets:
            self.params_ahead_hits += 1
            return ready[2]
        return self._params_at(b, offsets) if self.plan.per_execute else ({}, b"")

    def _params_at(self, b, offsets: dict) -> tuple:
        """(attributes, params prefix) of b's offset-dependent steps at `offsets`."""
        attrs = self.plan.attrs_at(b, offsets)
        return attrs, self._dynamic_params(b, attrs) if b.payload.dynamic else b""

    def _predict_params(self, b, offsets: dict) -> None:
        """Compute the next execute's offset-dependent attributes and params prefix while the
        GPU runs this one, at offsets that repeat the last step (a decode step: the position
        one token on). On the H100, ExecuTorch's Llama-3.2-1B decode spent ~650 us a step in
        _upload, before the GPU started, mostly computing these. Not for a binding with grid
        sites, where computing the params moves grids; a guess the checks refuse is dropped
        (that execute, if it comes, raises the error itself)."""
        last, self._offsets_last = self._offsets_last, (b, offsets)
        if (not self.params_ahead or not offsets or last is None or last[0] is not b
                or b.payload.grid_sites):
            return
        guess = {name: 2 * v - last[1][name] for name, v in offsets.items()}
        try:
            self._params_next = (b, guess, self._params_at(b, guess))
        except DelegateError:
            pass

    def _dynamic_params(self, b, attrs_now: dict) -> bytes:
        """The params prefix (offset-dependent dispatches, _params_offsets) at this execute."""
        block = bytearray(b.payload.params[:self._dynamic_bytes])
        for i, d, key in b.payload.dynamic:
            st = self.plan.steps[i]
            attrs = attrs_now[i]
            ins = [None if v == -1 else b.live[v] for v in st.inputs]
            grid = self._write_params(d, block, ins, [b.live[v] for v in st.outputs], attrs,
                                      st) or (0, 0)
            sites = b.payload.grid_sites.get(key)
            if sites is not None:
                b.payload.regrids += _regrid(sites, grid)
            elif grid != b.payload.fixed_grids[key]:
                raise ProgramError(f"{st.where()} {d.spec.entry}: expected the grid "
                                   f"{b.payload.fixed_grids[key]} its kernel declares fixed at "
                                   f"every offset, got {grid} at {attrs}")
        return bytes(block)

    def execute_profiled(self, inputs: list, mode: str = "each") -> tuple:
        """(outputs, [("entry [op]", seconds)], clock), timed by GPU timestamp queries ("gpu")
        or, without them, by waiting on each dispatch ("wall"). `mode`:
          "each":     each dispatch in its own compute pass, its own time;
          "whole":    every dispatch in one pass, as execute encodes them, one entry: a pass
                      per dispatch adds its start-up and drain to each, which a small kernel's
                      time can be mostly made of;
          "marginal": pass k holds the first k dispatches, and entry k is what the k-th adds
                      to one pass (pass k's time less pass k - 1's). It replays dispatches, so
                      it suits programs whose dispatches may run again (a cache write at one
                      position may; an in-place accumulation may not);
          "dropped":  pass k holds every dispatch but the k-th, and entry k is what leaving
                      it out saves from one pass (the whole pass's time less pass k's): what
                      fusing the k-th away could win at most, where "marginal" charges a
                      dispatch with the start-up of the pass when it comes first. The whole
                      pass and the n passes run back to back in one submit, so that each
                      difference compares passes on an equally busy GPU (a submit of its own
                      starts from idle, which moved these differences by +-5 us on an H100);
                      then the inputs are uploaded again and the whole pass runs once more
                      for the outputs. It replays dispatches, as "marginal" does."""
        if mode not in PROFILE_MODES:
            raise InputError(f"execute_profiled mode: expected one of {PROFILE_MODES}, "
                                f"got {mode!r}")
        if mode in REPLAYING_MODES and self.graph.state_updates:
            raise InputError(f"execute_profiled mode {mode!r} replays dispatches: expected a "
                             f"program without state, got {len(self.graph.state_updates)} "
                             f"state updates")
        b = self.plan.binding_for(inputs)
        attrs_now = self._upload(b, inputs)
        plan = [item for item in b.payload.dispatches if item[1][0]]   # (0, 0): none now
        if not self._gpu.has_timestamps or len(b.payload.parts) > 1:
            return self._wall_profiled(b, inputs, attrs_now)
        labels = [f"{d.spec.entry} [{d.op}]" for d, _ in plan]
        fresh: set = set()   # passes that start over from the inputs (replaying modes)
        if mode == "whole":
            passes, labels = [plan], [f"whole pass [{len(plan)} dispatches]"]
        elif mode == "marginal":
            passes, labels = [plan[:k + 1] for k in range(len(plan))], [f"+{x}" for x in labels]
            fresh = set(range(1, len(passes)))
        elif mode == "dropped":
            passes = [plan] + [plan[:k] + plan[k + 1:] for k in range(len(plan))] + [plan]
            labels, fresh = [f"-{x}" for x in labels], {len(passes) - 1}
        else:
            passes = [[item] for item in plan]
        outs, ticks = self._stamped(b, passes, inputs, fresh)
        # WebGPU timestamps are nanoseconds
        spans = [float(ticks[2 * i + 1] - ticks[2 * i]) * 1e-9 for i in range(len(passes))]
        if mode == "marginal":
            spans = [t - (spans[i - 1] if i else 0.0) for i, t in enumerate(spans)]
        elif mode == "dropped":
            spans = [spans[0] - t for t in spans[1:-1]]
        return outs, list(zip(labels, spans)), "gpu"

    def _stamped(self, b, passes: list, inputs: list, fresh=frozenset()) -> tuple:
        """Run `passes` (lists of dispatches), each a compute pass with begin and end
        timestamps: (outputs, int64 tensor of the 2 stamps per pass). A pass whose index is
        in `fresh` starts a submit of its own after the inputs are uploaded again: a pass that
        starts over from the inputs may find them overwritten by values the planner let
        share their buffers."""
        import wgpu

        device = self._gpu.device
        queries = device.create_query_set(type="timestamp", count=max(2, 2 * len(passes)))
        stamps = device.create_buffer(size=max(16, 16 * len(passes)),
                                      usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        try:
            encoder = device.create_command_encoder()
            for i, dispatches in enumerate(passes):
                if i in fresh:
                    self._gpu.queue.submit([encoder.finish()])
                    self._upload(b, inputs)
                    encoder = device.create_command_encoder()
                writes = {"query_set": queries, "beginning_of_pass_write_index": 2 * i,
                          "end_of_pass_write_index": 2 * i + 1}
                self._encode(encoder.begin_compute_pass(timestamp_writes=writes), dispatches)
            if passes:
                encoder.resolve_query_set(queries, 0, 2 * len(passes), stamps, 0)
            outs = self._finish(encoder, b, None)
            raw = bytearray(self._gpu.queue.read_buffer(stamps))
        finally:
            queries.destroy()
            stamps.destroy()
        return outs, torch.frombuffer(raw, dtype=torch.int64)

    def _wall_profiled(self, b, inputs, attrs_now: dict) -> tuple:
        """Each dispatch submitted and waited for on its own; a CPU fallback run timed whole."""
        import time

        times, device = [], self._gpu.device
        for part in b.payload.parts:
            if not isinstance(part, list):
                t0 = time.perf_counter()
                cpu_fallback.run(self, part, device.create_command_encoder(), inputs, attrs_now)
                ops = sorted({self.plan.steps[i].op for i in part.steps})
                times.append((f"cpu fallback [{', '.join(ops)}]", time.perf_counter() - t0))
                continue
            for d, grid in part:
                if not grid[0]:
                    continue
                encoder = device.create_command_encoder()
                self._encode(encoder.begin_compute_pass(), [(d, grid)])
                t0 = time.perf_counter()
                self._gpu.queue.submit([encoder.finish()])
                self._gpu.queue.read_buffer(self._dummy)   # waits for the submission to finish
                times.append((f"{d.spec.entry} [{d.op}]", time.perf_counter() - t0))
        return self._finish(device.create_command_encoder(), b, None), times, "wall"

    def _encode(self, compute, plan) -> None:
        """Record plan's dispatches into the compute pass and end it. Through RawPassCalls
        where offered (~3x cheaper per dispatch), else wgpu-py's checked calls; a pipeline
        already set is not set again."""
        raw, last = self._raw, None
        if raw is None:
            for d, (x, y) in plan:
                if not x:   # a dynamic dispatch this execute's offsets leave empty
                    continue
                if d.pipeline is not last:
                    compute.set_pipeline(d.pipeline)
                    last = d.pipeline
                compute.set_bind_group(0, d.bind_group)
                compute.dispatch_workgroups(x, y)
        else:
            pass_, null = raw.handle(compute), raw.null
            set_pipeline, set_group, dispatch = raw.set_pipeline, raw.set_bind_group, raw.dispatch
            for d, (x, y) in plan:
                if not x:
                    continue
                pipeline, group = d.raw
                if pipeline != last:
                    set_pipeline(pass_, pipeline)
                    last = pipeline
                set_group(pass_, 0, group, 0, null)
                dispatch(pass_, x, y, 1)
        compute.end()

    def _fold(self, count: int) -> tuple:
        """Workgroup count -> (x, y) within the per-dimension limit; kernels use wg_linear()."""
        most = self._gpu.limits["max-compute-workgroups-per-dimension"]
        if count <= most:
            return (count, 1)
        y = -(-count // most)
        return (-(-count // y), y)

    def _finish(self, encoder, b, outputs) -> list:
        """Copy the live output bytes to the readback buffer, submit, and read them straight
        into the output tensors (the caller's when given)."""
        self._encode_copies(encoder, b)
        self._gpu.queue.submit([encoder.finish()])
        return self._read(b, outputs)

    def _encode_copies(self, encoder, b) -> None:
        """The state copies and the copies of b's live output bytes into the readback buffer."""
        for value, state in self._state_copies:   # states whose new value lives elsewhere
            nbytes = kernels_wgsl.numel(self.graph.values[state].max_shape) * ELEMENT_BYTES
            if nbytes:
                encoder.copy_buffer_to_buffer(self._buffer_of(value), 0, self._states[state], 0,
                                              nbytes)
        for _, src, off, size in b.payload.reads:
            if size:
                encoder.copy_buffer_to_buffer(src, 0, self._readback, off, size)

    def _read(self, b, outputs) -> list:
        """Wait for the submitted execute and read the live output bytes straight into the
        output tensors (the caller's when given)."""
        r = b.payload
        results = []
        for j, vid in enumerate(self.graph.outputs):
            dtype = self.graph.values[vid].dtype
            out = outputs[j] if outputs is not None else torch.empty(b.live[vid], dtype=dtype)
            if out.shape != b.live[vid]:
                resize_within(out, b.live[vid], vid)
            results.append(out)
        if not r.readback_bytes:
            return results
        self.transfers.download(r.readback_bytes)
        raw = self._gpu.map_read(self._readback, _align4(r.readback_bytes))
        try:
            for (j, _, off, size), out in zip(r.reads, results):
                if size:
                    self._copy_out(raw, out, off, size)
        finally:
            self._gpu.unmap_read(self._readback)
        return results

    def _copy_out(self, raw, out: torch.Tensor, off: int, size: int) -> None:
        """size mapped bytes from off into out: by address where they are out's bytes as they
        are, else numpy copies (and widens int32 -> int64) from the mapped bytes."""
        if out.dtype in _SAME_ON_GPU and out.is_contiguous() and self._gpu.copy_mapped(out, off):
            return
        gpu = np.frombuffer(raw, dtype=_NP_DTYPES[out.dtype], count=size // ELEMENT_BYTES,
                            offset=off)
        np.copyto(out.numpy(), (gpu != 0 if out.dtype == torch.bool else gpu).reshape(out.shape),
                  casting="unsafe")

    # ---- introspection and teardown ----------------------------------------------------------
    def dispatch_list(self) -> list:
        """[(op, kernel label, slots read, slots written, node output ids)] in submission order."""
        return [(st.op, d.spec.label or d.spec.entry, d.reads, d.writes, tuple(st.outputs))
                for st, bound in zip(self.plan.steps, self._steps) for d in bound]

    def output_slots(self) -> list:
        """(value id whose bytes each graph output is, its buffer slot) per graph output."""
        return [(self._root.get(v, v), self._slot_of(v)) for v in self.graph.outputs]

    def describe(self) -> dict:
        return {"device": "webgpu", "adapter": self._gpu.name,
                "ops": [n.op for n in self.graph.nodes],
                "dispatches": sum(len(bound) for bound in self._steps),
                "buffers": len(self._slots) if hasattr(self, "_slots") else 0,
                "activation_bytes": sum(s.nbytes for s in getattr(self, "_slots", [])),
                "weight_bytes": sum(b.size for b in getattr(self, "_weights", {}).values()),
                "state_bytes": sum(b.size for b in getattr(self, "_states", {}).values()),
                "params_bytes": getattr(self, "_params_bytes", 0),
                "transfers": vars(self.transfers),
                "shader_f16": self._gpu.has_f16, "timestamps": self._gpu.has_timestamps,
                "plans": vars(self.plan.stats) if self.plan else {}}

    def destroy(self) -> None:
        """Free every buffer, bind group and uniform of this load and release its pipelines."""
        if self._held:
            self._submit_held()
        self._last = self._offsets_last = self._params_next = None
        for buf in self._buffers:
            buf.destroy()
        self._buffers = []
        for key in self._pipeline_keys:
            self._gpu.release_pipeline(key)
        self._pipeline_keys = []
        self._steps = []
        self._ahead = None
        self.plan = None
        self._slots, self._weights, self._states, self._loc = [], {}, {}, {}
        self._readback = self._dummy = self._dummy_rw = self._params_buffer = None
        self._scratch = []


# ---- helpers ----------------------------------------------------------------------------------
def _declared_fixed(d, ins, attrs) -> bool:
    """Whether d's kernel declares its grid the same at every offset of these live shapes."""
    fixed = d.spec.fixed_grid
    return fixed is not None and bool(fixed(ins, attrs))


def _regrid(sites: list, grid: tuple) -> bool:
    """Set the grid of a dynamic dispatch and its twins' where this execute's offsets moved
    it (the binding's lists hold the last execute's grids; (0, 0) encodes nothing); True when
    it moved."""
    lst, k = sites[0]
    if lst[k][1] == grid:
        return False
    for lst, k in sites:
        lst[k] = (lst[k][0], grid)
    return True


def _same_dispatches(a: list, b: list) -> bool:
    """Two steps' [(Dispatch, params size)] run the same kernels with params of one size."""
    return len(a) == len(b) and all((x.entry, x.label, n) == (y.entry, y.label, m)
                                    for (x, n), (y, m) in zip(a, b))


def _pieces(part: list, every: int | None = None) -> list:
    """The submits of one dispatch list: whole when short; else a first piece of
    min(half, SPLIT_SUBMIT_MIN) dispatches, then `every` (default SUBMIT_EVERY) at a time."""
    if len(part) < SPLIT_SUBMIT_MIN:
        return [part]
    every = every or SUBMIT_EVERY
    first = min(len(part) // 2, SPLIT_SUBMIT_MIN)
    return [part[:first]] + [part[i:i + every] for i in range(first, len(part), every)]


def _alias_roots(nodes, kernels) -> dict:
    """value id -> the value whose bytes it is: outputs of alias (view) kernels, which run no
    dispatch, and of in-place ops (a cache write), which write into their input 0."""
    root = {}
    for node, kernel in zip(nodes, kernels):
        if (kernel is not None and kernel.alias) or registry.get_op(node.op).in_place:
            src = node.inputs[0]
            root[node.outputs[0]] = root.get(src, src)
    return root


def _capacity(spec: TensorValue) -> int:
    if spec.dtype not in _GPU_DTYPES:
        raise UnsupportedError(f"tensor dtype on WebGPU: expected one of "
                               f"{[str(d) for d in _GPU_DTYPES]}, got {spec.dtype}")
    return kernels_wgsl.numel(spec.max_shape) * ELEMENT_BYTES


def _check_binding(nbytes: int, limit: int, what: str) -> None:
    if nbytes > limit:
        raise DeviceError(f"{what}: expected at most {limit} bytes per storage binding on this "
                          f"adapter, got {nbytes}")


_I32_MIN, _I32_MAX = -2 ** 31, 2 ** 31 - 1


def _to_gpu_dtype(t: torch.Tensor, what: str, error=InputError) -> torch.Tensor:
    """t as the GPU holds it. int64 is held as int32 (WGSL has no 64-bit integers): a value
    past int32's range would wrap silently, so it is refused instead (`error`: InputError for
    an input, UnsupportedError for a weight or state at load)."""
    if t.dtype not in _GPU_DTYPES:
        raise error(f"{what} dtype on WebGPU: expected one of "
                    f"{[str(d) for d in _GPU_DTYPES]}, got {t.dtype}")
    if t.dtype == torch.int64 and t.numel():
        lo, hi = (int(v) for v in torch.aminmax(t))
        if lo < _I32_MIN or hi > _I32_MAX:
            raise error(f"{what} on WebGPU: expected int64 values within int32's range "
                        f"[{_I32_MIN}, {_I32_MAX}] (the GPU holds int64 as int32), got values "
                        f"in [{lo}, {hi}]")
    return t.to(_GPU_DTYPES[t.dtype])


def _from_gpu_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t != 0 if dtype == torch.bool else t.to(dtype)


def _align4(n: int) -> int:
    return (int(n) + 3) // 4 * 4

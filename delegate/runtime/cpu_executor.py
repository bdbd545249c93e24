"""The CPU executor: runs a decoded IR graph with kernels_cpu on the shared thread pool.

Built once per load: weights as tensors, one value arena planned by liveness at the upper-bound
shapes, one scratch arena sized for the hungriest kernel, and the graph plan. The first execute
of a binding prepares every kernel call: its input and output views of the arena at the live
shapes and its resolved attributes. An execute then only drops the caller's inputs and output
tensors into those prepared argument lists and calls the kernels: no shape inference, no
allocation but the outputs handed back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels_cpu
from delegate import symexpr
from delegate.errors import BlobError, DelegateError, InputError, KernelError
from delegate.ir import Graph, TensorValue
from delegate.runtime import planner
from delegate.runtime.graph_plan import Binding, GraphPlan
from delegate.runtime.memory import allocate, nbytes_of
from delegate.runtime.values import resize_within
from kernels_cpu.threadpool import ScratchArena, get_pool, single_threaded_torch


@dataclass
class Replay:
    """One binding's prepared kernel calls."""
    calls: list           # [(kernel fn, ins list, outs list, attrs)] per step
    inputs: list          # [(graph input position, [(arg list, index), ...])]
    outputs: list         # [(shape, dtype, (source kind, what))] per graph output
    updates: list         # [(state tensor, new value: tensor, or graph input position)]


class CpuExecutor:
    device = "cpu"

    def __init__(self, graph: Graph, weights: dict):
        self.graph = graph
        self._weights = {
            vid: weights[v.constant_key] for vid, v in enumerate(graph.values)
            if isinstance(v, TensorValue) and v.constant_key and not v.state
        }
        # each state its own writable copy (two may start from the same bytes); resident
        self._states = {vid: weights[v.constant_key].clone() for vid, v in enumerate(graph.values)
                        if isinstance(v, TensorValue) and v.state}
        self._root = planner.in_place_roots(graph)
        self._kernels = [kernels_cpu.get_kernel(n.op) for n in graph.nodes]
        self.plan = GraphPlan(graph, self._replay)
        self._plan_arena()
        need = scratch_bytes(self.plan, dict(enumerate(self._kernels)))
        self._scratch = ScratchArena(0)
        self._scratch_view = self._scratch.adopt(allocate(need, "kernel scratch"))

    def _plan_arena(self) -> None:
        lives = planner.shared_lifetimes(self.graph, self._root)
        values = self.graph.values
        sizes = {vid: nbytes_of(values[vid].max_shape, values[vid].dtype) for vid in lives}
        self._offsets, total = planner.plan_offsets(sizes, lives)
        self._capacity = sizes
        self._arena = allocate(total, "value arena")

    # ---- per binding ---------------------------------------------------------------------------
    def _replay(self, b: Binding) -> Replay:
        graph = self.graph
        views = {vid: self._view(vid, b.live[vid]) for vid in self._offsets}
        views.update(self._weights)
        views.update(self._states)
        views.update((vid, views[root]) for vid, root in self._root.items() if root in views)
        patches: dict = {}     # graph input / output value id -> [(arg list, index)]
        external = set(graph.inputs) | set(graph.outputs)
        # storage of its own (weights, states, in-place results): never a caller's tensor
        fixed = set(self._weights) | set(self._states) | set(self._root)
        calls = []
        for st, kernel, attrs in zip(self.plan.steps, self._kernels, b.attrs):
            ins = [None if v == -1 else views.get(v) for v in st.inputs]
            outs = [views[v] for v in st.outputs]
            for lst, ids in ((ins, st.inputs), (outs, st.outputs)):
                for k, v in enumerate(ids):
                    if v in external and v not in fixed:
                        patches.setdefault(v, []).append((lst, k))
            calls.append((kernel.fn, ins, outs, attrs))
        inputs = [(pos, patches.pop(vid, [])) for pos, vid in enumerate(graph.inputs)
                  if isinstance(graph.values[vid], TensorValue)]
        outputs, first = [], {}
        for j, vid in enumerate(graph.outputs):
            if vid in first:
                source = ("output", first[vid])
            elif vid in graph.inputs:
                source = ("input", graph.inputs.index(vid))
            elif vid in fixed:
                source = ("weight", views[vid])
            else:
                source = ("sites", patches.get(vid, []))
            first.setdefault(vid, j)
            outputs.append((b.live[vid], graph.values[vid].dtype, source))
        updates = [(self._states[u.state], graph.inputs.index(u.value) if u.value in graph.inputs
                    else views[u.value]) for u in graph.state_updates
                   if self._root.get(u.value, u.value) != u.state]
        return Replay(calls, inputs, outputs, updates)

    def _view(self, vid: int, shape: tuple) -> torch.Tensor:
        spec = self.graph.values[vid]
        size = nbytes_of(shape, spec.dtype)
        if size > self._capacity[vid]:
            raise InputError(
                f"value {vid} shape {shape}: expected at most {self._capacity[vid]} bytes "
                f"(upper bound {spec.max_shape}), got {size}"
            )
        off = self._offsets[vid]
        return self._arena[off: off + size].view(spec.dtype).view(shape)

    # ---- execute -------------------------------------------------------------------------------
    def execute(self, inputs: list, outputs: list | None = None) -> list:
        """Run the graph. `outputs`, when given, are the caller's tensors for the graph outputs
        (the runner's planned values): kernels write straight into them and they are returned.
        Otherwise fresh tensors are returned. Either way a later execute never writes them."""
        b = self.plan.binding_for(inputs)
        r = b.payload
        self._bind_inputs(r, inputs)
        bound = self._bind_outputs(r, outputs)
        attrs_now = self.plan.dynamic_attrs(b, inputs) if self.plan.per_execute else None
        try:
            with single_threaded_torch():
                self._run(r.calls, attrs_now)
            results = self._finish(r, bound, inputs)
            _update_states(r, inputs)
        finally:
            self._bind_inputs(r, None)   # the replay holds no caller tensor between executes
        return results

    def _bind_inputs(self, r: Replay, inputs: list | None) -> None:
        """Patch each input into the kernel calls that read it (None: unpatch)."""
        for pos, sites in r.inputs:
            t = None if inputs is None else inputs[pos]
            if t is not None and not t.is_contiguous():
                t = t.contiguous()
            for lst, k in sites:
                lst[k] = t

    @staticmethod
    def _bind_outputs(r: Replay, outputs) -> list:
        """Per graph output: (tensor handed back, tensor the kernels write), patched in."""
        bound = []
        for j, (shape, dtype, source) in enumerate(r.outputs):
            out = None
            if outputs is not None:
                out = outputs[j]
                if not isinstance(out, torch.Tensor) or out.dtype != dtype:
                    raise InputError(f"output {j}: expected a {dtype} tensor to write, got "
                                     f"{getattr(out, 'dtype', type(out).__name__)}")
                if out.shape != shape:
                    resize_within(out, shape, j)
            written = out if out is not None and out.is_contiguous() else None
            if source[0] == "sites":
                if written is None:   # kernels write dense memory: a strided output copies
                    written = torch.empty(shape, dtype=dtype)
                for lst, k in source[1]:
                    lst[k] = written
            bound.append((written if out is None else out, written))
        return bound

    @staticmethod
    def _finish(r: Replay, bound: list, inputs: list) -> list:
        """Fill what no kernel wrote in place; return the output tensors."""
        results = []
        for (shape, dtype, source), (out, written) in zip(r.outputs, bound):
            kind, src = source
            if kind == "input":
                src = inputs[src]
            elif kind == "output":
                src = results[src]
            elif kind == "sites":
                src = written
            if out is None:
                out = src.clone()
            elif out is not src:
                out.copy_(src)
            results.append(out)
        return results

    def _run(self, calls: list, attrs_now) -> None:
        scratch, check, i = self._scratch_view, self.plan.validating, 0
        try:
            for i, (fn, ins, outs, attrs) in enumerate(calls):
                if attrs_now:
                    attrs = attrs_now.get(i, attrs)
                if check:   # ETWGPU_VALIDATE=1: kernels must leave outputs at inferred shapes
                    want = [tuple(o.shape) for o in outs]
                fn(ins, outs, attrs, scratch)
                if check and [tuple(o.shape) for o in outs] != want:
                    raise BlobError(f"kernel output shapes: expected {want} (shape inference),"
                                    f" got {[tuple(o.shape) for o in outs]}")
        except DelegateError as e:
            raise type(e)(f"{self.plan.steps[i].where()}: {e}") from None
        except Exception as e:  # noqa: BLE001 - a kernel's raw error gets its node
            raise KernelError(f"{self.plan.steps[i].where()}: expected the kernel to run, got "
                              f"{type(e).__name__}: {e}") from e

    def execute_profiled(self, inputs: list) -> tuple:
        """(outputs, [("op [source node]", seconds)], "wall"): each kernel timed on its own."""
        import time

        b = self.plan.binding_for(inputs)
        r = b.payload
        self._bind_inputs(r, inputs)
        bound = self._bind_outputs(r, None)
        attrs_now = self.plan.dynamic_attrs(b, inputs) if self.plan.per_execute else {}
        times, scratch = [], self._scratch_view
        with single_threaded_torch():
            for st, (fn, ins, outs, attrs) in zip(self.plan.steps, r.calls):
                t0 = time.perf_counter()
                fn(ins, outs, attrs_now.get(st.index, attrs), scratch)
                times.append((f"{st.op} [{st.name or st.index}]", time.perf_counter() - t0))
        results = self._finish(r, bound, inputs)
        _update_states(r, inputs)
        self._bind_inputs(r, None)
        return results, times, "wall"

    def describe(self) -> dict:
        return {"device": "cpu", "threads": get_pool().num_threads,
                "ops": [n.op for n in self.graph.nodes], "arena_bytes": self._arena.numel(),
                "state_bytes": sum(t.nbytes for t in self._states.values()),
                "scratch_bytes": self._scratch.nbytes, "plans": vars(self.plan.stats)}

    def destroy(self) -> None:
        self._arena = torch.empty(0, dtype=torch.uint8)
        self._weights, self._states = {}, {}
        self._scratch.release()
        self._scratch_view = None
        self.plan = None


def _update_states(r: Replay, inputs: list) -> None:
    """States whose new value no kernel wrote in place take it now, after the outputs."""
    for state, src in r.updates:
        state.copy_(inputs[src] if isinstance(src, int) else src)


def scratch_bytes(plan: GraphPlan, kernels: dict) -> int:
    """Scratch the hungriest of these kernels (step index -> CpuKernel) needs at the upper
    bounds; the CPU fallback inside a WebGPU load sizes its scratch with it too."""
    env = plan.max_env()
    workers = get_pool().num_threads
    max_shapes = {vid: v.max_shape for vid, v in enumerate(plan.graph.values)
                  if isinstance(v, TensorValue)}
    need = 0
    for st in plan.steps:
        kernel = kernels.get(st.index)
        if kernel is not None and kernel.scratch_nbytes is not None:
            attrs = symexpr.resolve(st.attrs, env) if st.symbols else st.attrs
            in_shapes = [None if v == -1 else max_shapes[v] for v in st.inputs]
            need = max(need, int(kernel.scratch_nbytes(in_shapes, attrs, workers)))
    return need

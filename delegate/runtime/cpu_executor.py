"""The CPU executor: runs a decoded IR graph with kernels_cpu on the shared thread pool.

Built once per load: weights as tensors, one value arena planned by liveness at the upper-bound
shapes, one scratch arena sized for the hungriest kernel, and a flat list of steps. Each
execute binds symbols from the live inputs, infers shapes node by node through the registry,
and runs each kernel into views of the arena.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels_cpu
from delegate import ops as registry
from delegate import symexpr
from delegate.errors import DelegateError, InputError
from delegate.ir import Graph, TensorValue
from delegate.runtime import planner, shapes
from kernels_cpu.threadpool import ScratchArena, get_pool, single_threaded_torch


@dataclass
class Step:
    op: str
    infer: object
    kernel: object
    inputs: list
    outputs: list
    attrs: dict
    symbolic: bool     # attrs hold symbolic sizes to resolve per execute


class CpuExecutor:
    device = "cpu"

    def __init__(self, graph: Graph, weights: dict):
        self.graph = graph
        self._weights = {
            vid: weights[v.constant_key] for vid, v in enumerate(graph.values)
            if isinstance(v, TensorValue) and v.constant_key
        }
        self._steps = [self._step(n) for n in graph.nodes]
        self._plan_arena()
        self._scratch = ScratchArena(self._scratch_bytes())

    def _step(self, node) -> Step:
        op = registry.get_op(node.op)
        kernel = kernels_cpu.get_kernel(node.op)
        return Step(node.op, op.infer, kernel, node.inputs, node.outputs, node.attrs,
                    shapes.has_symbols(node.attrs))

    def _plan_arena(self) -> None:
        lives = planner.lifetimes(self.graph)
        sizes = {vid: _nbytes(self.graph.values[vid], self.graph.values[vid].max_shape) for vid in lives}
        self._offsets, total = planner.plan_offsets(sizes, lives)
        self._capacity = sizes
        self._arena = torch.empty(total, dtype=torch.uint8)

    def _scratch_bytes(self) -> int:
        env = self._max_env()
        workers = get_pool().num_threads
        shapes_now = {vid: self.graph.values[vid].max_shape for vid in self._offsets}
        shapes_now.update({vid: tuple(w.shape) for vid, w in self._weights.items()})
        need = 0
        for st in self._steps:
            attrs = symexpr.resolve(st.attrs, env) if st.symbolic else st.attrs
            in_shapes = [None if v == -1 else shapes_now[v] for v in st.inputs]
            if st.kernel.scratch_nbytes is not None:
                need = max(need, int(st.kernel.scratch_nbytes(in_shapes, attrs, workers)))
        return need

    def _max_env(self) -> dict:
        """Every symbol at its upper bound, read off the dims it binds to."""
        env = {}
        for s in self.graph.symbols:
            spec = self.graph.values[self.graph.inputs[s.input]]
            if isinstance(spec, TensorValue):
                env[s.name] = spec.max_shape[s.dim]
        for vid in self.graph.inputs:  # symbols bound only by scalar inputs
            spec = self.graph.values[vid]
            if isinstance(spec, TensorValue):
                for d, m in zip(spec.dims, spec.max_shape):
                    if isinstance(d, str) and d.isidentifier():
                        env.setdefault(d, m)
        return env

    # ---- execute -----------------------------------------------------------------------------
    def execute(self, inputs: list) -> list:
        env = shapes.bind_inputs(self.graph, inputs)
        vals = dict(self._weights)
        for vid, t in zip(self.graph.inputs, inputs):
            vals[vid] = self._view(vid, tuple(t.shape)).copy_(t) if vid in self._offsets else t
        scratch = self._scratch.reserve(self._scratch.nbytes)
        with single_threaded_torch():
            for st in self._steps:
                self._run(st, vals, env, scratch)
        return [vals[v].clone() for v in self.graph.outputs]

    def _run(self, st: Step, vals: dict, env: dict, scratch) -> None:
        attrs = symexpr.resolve(st.attrs, env) if st.symbolic else st.attrs
        ins = [None if v == -1 else vals[v] for v in st.inputs]
        out_shapes = st.infer([None if t is None else tuple(t.shape) for t in ins], attrs)
        outs = []
        for vid, shape in zip(st.outputs, out_shapes):
            expect = shapes.live_shape(self.graph.values[vid], env)
            if tuple(shape) != expect:
                raise DelegateError(
                    f"{st.op} output shape: expected {expect} (from export), got {tuple(shape)}"
                )
            vals[vid] = self._view(vid, expect)
            outs.append(vals[vid])
        st.kernel.fn(ins, outs, attrs, scratch)

    def _view(self, vid: int, shape: tuple) -> torch.Tensor:
        spec = self.graph.values[vid]
        nbytes = _nbytes(spec, shape)
        if nbytes > self._capacity[vid]:
            raise InputError(
                f"value {vid} shape {shape}: expected at most {self._capacity[vid]} bytes "
                f"(upper bound {spec.max_shape}), got {nbytes}"
            )
        off = self._offsets[vid]
        return self._arena[off: off + nbytes].view(spec.dtype).view(shape)

    def describe(self) -> dict:
        return {"device": "cpu", "threads": get_pool().num_threads,
                "ops": [n.op for n in self.graph.nodes], "arena_bytes": self._arena.numel(),
                "scratch_bytes": self._scratch.nbytes}

    def destroy(self) -> None:
        self._arena = torch.empty(0, dtype=torch.uint8)
        self._weights = {}
        self._scratch.release()
        self._steps = []


def _nbytes(spec: TensorValue, shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n * torch.empty((), dtype=spec.dtype).element_size()

"""The graph plan both executors replay: static facts once per load, live facts once per binding.

At load: one Step per IR node (its registry shape function, attributes, debug name) and the
upper-bound symbol environment. The first execute of each binding of the *shape symbols*
builds a Binding: the live shape of every value and the resolved attributes of every step,
checked by the registry's `infer` (the validation pass), plus whatever the executor derives
from them (kernel views on CPU, params and grids on WebGPU). Later executes with the same
binding find it in a small LRU cache and replay it; `ETWGPU_VALIDATE=1` re-runs the
validation on every execute.

Shape symbols occur in some value's dims and key the cache. Offset symbols occur only in
attributes (a cache write at `pos`, `narrow(mask, 0, pos, T)`): they move data, not shapes, so
they key nothing; the steps that read them are re-resolved per execute (`dynamic_steps`).
"""
from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import torch

from delegate import ops as registry
from delegate import symexpr
from delegate.errors import BlobError, DelegateError, InputError
from delegate.ir import Graph, SymExpr, TensorValue
from delegate.runtime import shapes

CACHE_SIZE = 16


def validate_every_execute() -> bool:
    return os.environ.get("ETWGPU_VALIDATE", "") not in ("", "0")


@dataclass
class Step:
    index: int
    op: str
    name: str             # the fx node it came from (debug handle), "" if unknown
    infer: Callable
    inputs: list
    outputs: list
    attrs: dict
    symbols: frozenset    # symbols its attributes mention

    def where(self) -> str:
        src = f" from {self.name!r}" if self.name else ""
        return f"node {self.index} ({self.op}{src})"


@dataclass
class Binding:
    """One binding of the shape symbols and everything derived from it."""
    key: tuple
    env: dict
    live: dict                          # value id -> live shape (tensors)
    attrs: list                         # resolved attributes per step
    n_inputs: int
    input_checks: tuple                 # (input index, dtype, shape) per tensor input
    int_inputs: tuple                   # indices of int scalar inputs
    payload: object = None              # the executor's replay data
    hits: int = 0


@dataclass
class PlanStats:
    hits: int = 0
    misses: int = 0
    validations: int = 0


class GraphPlan:
    def __init__(self, graph: Graph, build: Callable[[Binding], object]):
        """build(binding) -> the executor's payload for a new binding."""
        self.graph = graph
        self._build_payload = build
        self.steps = [_step(i, n) for i, n in enumerate(graph.nodes)]
        dim_syms = _dim_symbols(graph)
        self.shape_bindings = [s for s in graph.symbols if s.name in dim_syms]
        self.offset_bindings = [s for s in graph.symbols if s.name not in dim_syms]
        offsets = {s.name for s in self.offset_bindings}
        self.dynamic_steps = [st.index for st in self.steps if st.symbols & offsets]
        self.twin = twins(graph, self.steps)
        # export's runtime asserts (torch._check on a position): once per binding when they
        # read only shape symbols, every execute when they read an offset
        checks = [(c, symexpr.symbols_of(c.expr)) for c in _distinct(graph.checks, graph)]
        self._binding_checks = [c for c, syms in checks if not syms & offsets]
        self._offset_checks = [c for c, syms in checks if syms & offsets]
        self.per_execute = bool(self.dynamic_steps or self._offset_checks)
        self._offset_steps = set(self.dynamic_steps)
        self._tensor_inputs = [(i, graph.values[vid]) for i, vid in enumerate(graph.inputs)
                               if isinstance(graph.values[vid], TensorValue)]
        self._cache: OrderedDict = OrderedDict()
        self.stats = PlanStats()
        self.validating = validate_every_execute()

    # ---- bindings ----------------------------------------------------------------------------
    def binding_for(self, inputs: list) -> Binding:
        """The cached binding these inputs select, built (and validated) on a miss."""
        b = self._cache.get(self._fast_key(inputs))
        if b is not None and _accepts(b, inputs):
            self.stats.hits += 1
            b.hits += 1
            self._cache.move_to_end(b.key)   # least recently used goes first, not oldest
            if self.validating:
                self._validate_binding(b)
            return b
        env = shapes.bind_inputs(self.graph, inputs)     # every input check, typed errors
        key = tuple(env.get(s.name) for s in self.shape_bindings)
        b = self._cache.get(key)
        if b is None:
            return self._new_binding(key, env)
        if not _accepts(b, inputs):  # bind_inputs passed them: a dense-CPU or layout matter
            raise InputError(f"inputs: expected dense CPU tensors {b.input_checks}, got "
                             f"{[(type(t).__name__, getattr(t, 'shape', t)) for t in inputs]}")
        self.stats.hits += 1
        self._cache.move_to_end(key)
        return b

    def _fast_key(self, inputs) -> tuple | None:
        try:
            return tuple(shapes.symbol_value(s, inputs) for s in self.shape_bindings)
        except (IndexError, TypeError, AttributeError, ValueError, RuntimeError):
            return None

    def offset_env(self, inputs: list) -> dict:
        """Values of the offset symbols for this execute (empty when the graph has none, or
        when no step or check reads one: nothing per execute uses them)."""
        if not self.per_execute:
            return {}
        try:   # each layer's `.item()` of one position is its own symbol: read it once
            read: dict = {}
            return {s.name: read[s.input, s.dim] if (s.input, s.dim) in read else
                    read.setdefault((s.input, s.dim), shapes.symbol_value(s, inputs))
                    for s in self.offset_bindings}
        except (IndexError, TypeError, AttributeError, ValueError, RuntimeError) as e:
            raise InputError(f"inputs: expected the values the offset symbols "
                             f"{[s.name for s in self.offset_bindings]} read, got "
                             f"{type(e).__name__}: {e}") from None

    def dynamic_attrs(self, b: Binding, inputs: list) -> dict:
        """step index -> its attributes at this execute's offsets, for the steps that read an
        offset symbol; each is checked by its shape function (a cache write past the end is an
        InputError here, before any kernel runs)."""
        return self.attrs_at(b, self.offset_env(inputs))

    def attrs_at(self, b: Binding, offsets: dict) -> dict:
        """dynamic_attrs at the offset symbols' values `offsets` (offset_env's dict)."""
        env = dict(b.env)
        env.update(offsets)
        _run_checks(self._offset_checks, env)
        out = {}
        for i in self.dynamic_steps:
            if self.twin[i] != i:   # its twin's attributes and check hold for it too
                out[i] = out[self.twin[i]]
                continue
            st = self.steps[i]
            attrs = symexpr.resolve(st.attrs, env)
            want = [b.live[v] for v in st.outputs]
            try:
                got = [tuple(s) for s in st.infer([None if v == -1 else b.live[v]
                                                   for v in st.inputs], attrs)]
            except DelegateError as e:
                raise InputError(f"{st.where()}: {e}") from None
            if got != want:   # a slice past its source's end at this offset
                raise InputError(f"{st.where()} at offsets {offsets}: expected "
                                 f"output shapes {want}, got {got}")
            out[i] = attrs
        return out

    def _new_binding(self, key: tuple, env: dict) -> Binding:
        self.stats.misses += 1
        values = self.graph.values
        live = {vid: shapes.live_shape(v, env) for vid, v in enumerate(values)
                if isinstance(v, TensorValue)}
        attrs = [symexpr.resolve(st.attrs, env) if st.symbols else st.attrs for st in self.steps]
        checks = tuple((i, spec.dtype, live[self.graph.inputs[i]])
                       for i, spec in self._tensor_inputs)
        ints = tuple(i for i, vid in enumerate(self.graph.inputs)
                     if getattr(values[vid], "kind", None) == "int")
        b = Binding(key, env, live, attrs, len(self.graph.inputs), checks, ints)
        _check_bounds(values, live)
        _run_checks(self._binding_checks + self._offset_checks, env)
        self._validate_binding(b)
        b.payload = self._build_payload(b)
        self._cache[key] = b
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return b

    def _validate_binding(self, b: Binding) -> None:
        """Registry shape inference must agree with the shapes recorded at export."""
        self.stats.validations += 1
        for st, attrs in zip(self.steps, b.attrs):
            ins = [None if v == -1 else b.live[v] for v in st.inputs]
            try:
                got = [tuple(s) for s in st.infer(ins, attrs)]
            except DelegateError as e:
                raise type(e)(f"{st.where()}: {e}") from None
            want = [b.live[v] for v in st.outputs]
            if got != want and st.index in self._offset_steps:   # the offsets are inputs
                raise InputError(f"{st.where()} at offsets {_offsets(b.env, self)}: expected "
                                 f"output shapes {want}, got {got}")
            if got != want:
                raise BlobError(f"{st.where()} output shapes: expected {want} (from export), "
                                f"got {got} from shape inference")

    def max_env(self) -> dict:
        return max_env(self.graph)


def _offsets(env: dict, plan: "GraphPlan") -> dict:
    return {s.name: env.get(s.name) for s in plan.offset_bindings}


def _run_checks(checks: list, env: dict) -> None:
    for c in checks:
        if symexpr.evaluate(c.expr, env) < 0:
            raise InputError(f"runtime check from the export: expected {c.expr} >= 0, got "
                             f"{symexpr.evaluate(c.expr, env)} at {env}"
                             + (f" ({c.message})" if c.message else ""))


def _check_bounds(values: list, live: dict) -> None:
    """Buffers are sized for the upper bounds: a live shape past them is a lying blob."""
    for vid, shape in live.items():
        bound = values[vid].max_shape
        if any(s < 0 or s > m for s, m in zip(shape, bound)):
            raise BlobError(f"value {vid} live shape: expected within its upper bound {bound}, "
                            f"got {shape}")


def twins(graph: Graph, steps: list) -> list:
    """step index -> the first step that is its twin: the same op over values of the same
    dtypes and symbolic shapes, with the same attributes. Twins agree on live shapes, resolved
    attributes and so on kernel params under every binding and offset (the layers of an LLM:
    a decode step resolves one rope, one cache write, ... instead of one per layer)."""
    same = _same_symbols(graph)
    first: dict = {}
    return [first.setdefault(_signature(graph, st, same), st.index) for st in steps]


def _distinct(checks: list, graph: Graph) -> list:
    """The export's runtime checks, one per expression up to symbols of one value (each
    layer checks its own copy of the position)."""
    same, seen = _same_symbols(graph), {}
    for c in checks:
        seen.setdefault(_frozen(SymExpr(c.expr), same), c)
    return list(seen.values())


def _same_symbols(graph: Graph) -> dict:
    """symbol -> the first symbol bound to the same input dim or element: export gives each
    layer's `input_pos.item()` its own unbacked symbol, all of one value."""
    first: dict = {}
    return {s.name: first.setdefault((s.input, s.dim), s.name) for s in graph.symbols}


def _signature(graph: Graph, st: Step, same: dict) -> tuple:
    def value(v):
        spec = None if v == -1 else graph.values[v]
        if isinstance(spec, TensorValue):
            return (spec.dtype, _frozen(spec.dims, same), tuple(spec.max_shape))
        return ("value", v)   # a scalar or list: its own identity, never a twin's

    return (st.op, _frozen(st.attrs, same), tuple(value(v) for v in st.inputs),
            tuple(value(v) for v in st.outputs))


def _frozen(x, same: dict):
    if isinstance(x, dict):
        return tuple(sorted((k, _frozen(v, same)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_frozen(v, same) for v in x)
    if isinstance(x, SymExpr):   # "4" stays apart from int 4
        return ("sym", symexpr.renamed(x, same))
    return (type(x).__name__, x)   # 1 and 1.0 stay apart


def _step(i: int, node) -> Step:
    op = registry.get_op(node.op)
    syms = frozenset().union(*(symexpr.symbols_of(e) for e in _sym_exprs(node.attrs)))
    return Step(i, node.op, getattr(node, "name", "") or "", op.infer, list(node.inputs),
                list(node.outputs), node.attrs, syms)


def _sym_exprs(x):
    if isinstance(x, SymExpr):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _sym_exprs(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _sym_exprs(v)


def _dim_symbols(graph: Graph) -> set:
    out = set()
    for v in graph.values:
        if isinstance(v, TensorValue):
            for d in v.dims:
                if isinstance(d, SymExpr):
                    out |= symexpr.symbols_of(d)
    return out


def _accepts(b: Binding, inputs) -> bool:
    """The cheap per-execute input check of a cached binding: kind, dtype and exact shape."""
    if len(inputs) != b.n_inputs:
        return False
    for i, dtype, shape in b.input_checks:
        t = inputs[i]
        if not (isinstance(t, torch.Tensor) and t.dtype == dtype and t.shape == shape
                and t.layout == torch.strided and t.is_cpu):
            return False
    for i in b.int_inputs:
        if type(inputs[i]) is not int:
            return False
    return True


def max_env(graph: Graph) -> dict:
    """Every symbol at its upper bound: read off a tensor input dim it binds, or, for symbols
    bound by a scalar input, off any value dim that is exactly that symbol."""
    env = {}
    for s in graph.symbols:
        spec = graph.values[graph.inputs[s.input]]
        if s.dim >= 0 and isinstance(spec, TensorValue):
            env[s.name] = spec.max_shape[s.dim]
    for v in graph.values:
        if isinstance(v, TensorValue):
            for d, m in zip(v.dims, v.max_shape):
                if isinstance(d, SymExpr) and d.isidentifier():
                    env.setdefault(d, m)
    dims = _dim_symbols(graph)
    missing = [s.name for s in graph.symbols if s.name not in env and s.name in dims]
    if missing:
        raise BlobError(f"symbols {missing}: expected an upper bound from some value's dims, "
                        f"got none")
    for s in graph.symbols:   # offset symbols size nothing: any value does for sizing
        env.setdefault(s.name, 0)
    return env

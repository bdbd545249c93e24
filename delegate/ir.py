"""Our IR: what preprocess produces, what the blob stores, and what the executors run.

A Graph is a list of values and a topologically ordered list of nodes. Tensor values carry a
static dtype and per-dim sizes that are either ints or symbolic expressions over the graph's
symbols ("s0", "2*s0"); `max_shape` gives every dim's upper bound, so executors size buffers
once per load and infer live shapes per execute.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import torch



class SymExpr(str):
    """A symbolic size: the text of an integer expression over the graph's symbols ("2*s0").

    A str subclass so it serialises as text, yet stays distinct from string attributes
    such as gelu's approximate="tanh".
    """

    __slots__ = ()


Dim = Union[int, SymExpr]       # an int, or a symbolic expression over the graph's symbols
AttrValue = Union[None, bool, int, float, str, list]


@dataclass
class TensorValue:
    dtype: torch.dtype
    dims: tuple                   # tuple[Dim, ...]
    max_shape: tuple              # tuple[int, ...], upper bounds of dims
    constant_key: Optional[str] = None   # named-data key for weights; None for activations
    # A mutable buffer the delegate owns (KV cache, recurrent state): initialised from
    # constant_key's bytes at load, resident across executes, updated by Graph.state_updates.
    state: bool = False

    @property
    def is_dynamic(self) -> bool:
        return any(isinstance(d, SymExpr) for d in self.dims)


@dataclass
class ScalarValue:
    """A graph input or output that is a number (for example a SymInt)."""
    kind: str                     # "int" | "float" | "bool"
    value: Union[int, float, bool, None] = None


@dataclass
class ListValue:
    """A list of value ids (a tensor list argument)."""
    items: list


Value = Union[TensorValue, ScalarValue, ListValue]


@dataclass
class Node:
    op: str                       # registered op name (delegate/ops)
    inputs: list                  # value ids; -1 for an absent optional input
    outputs: list                 # value ids
    attrs: dict = field(default_factory=dict)
    name: str = ""                # the fx node it was lowered from (debug handle)


@dataclass
class SymbolBinding:
    """Symbol `name` takes the live size of dim `dim` (>= 0) of graph input number `input`;
    dim -1-k: the value of element k of that input (`input_pos.item()`; a scalar: dim -1)."""
    name: str
    input: int
    dim: int

    @property
    def element(self) -> int:
        """Flat element index for a value binding (dim < 0)."""
        return -1 - self.dim


@dataclass
class StateUpdate:
    """After every execute state value `state` holds what value `value` held."""
    state: int
    value: int


@dataclass
class Check:
    """A runtime assertion kept from the export: `expr` >= 0 at every execute."""
    expr: SymExpr
    message: str = ""


@dataclass
class Graph:
    values: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    inputs: list = field(default_factory=list)    # value ids, in delegate-call order
    outputs: list = field(default_factory=list)   # value ids, in delegate-call order
    symbols: list = field(default_factory=list)   # SymbolBinding
    state_updates: list = field(default_factory=list)   # StateUpdate
    checks: list = field(default_factory=list)          # Check

    def add_value(self, v: Value) -> int:
        self.values.append(v)
        return len(self.values) - 1

    def tensor(self, vid: int) -> TensorValue:
        v = self.values[vid]
        assert isinstance(v, TensorValue), f"value {vid} is {type(v).__name__}"
        return v


def is_sym(x) -> bool:
    return isinstance(x, SymExpr)


def last_reads(graph: Graph) -> dict:
    """value id -> index of the last node reading it; len(nodes) for what the end of an
    execute reads (graph outputs, state update sources). List items count as read."""
    out: dict = {}
    for k, node in enumerate(graph.nodes):
        for vid in node.inputs:
            if vid == -1:
                continue
            v = graph.values[vid]
            for item in (v.items if isinstance(v, ListValue) else [vid]):
                out[item] = k
    end = len(graph.nodes)
    for vid in list(graph.outputs) + [u.value for u in graph.state_updates]:
        out[vid] = end
    return out


def in_place_ok(graph: Graph, k: int, reads: dict) -> bool:
    """Node k may overwrite its input 0: a state or an earlier node's output, of the output's
    dtype and shape, that nothing reads after node k (see OpDef.in_place)."""
    node = graph.nodes[k]
    if not node.inputs or not node.outputs or node.inputs[0] == -1:
        return False
    src, out = graph.values[node.inputs[0]], graph.values[node.outputs[0]]
    produced = any(node.inputs[0] in n.outputs for n in graph.nodes[:k])
    return (isinstance(src, TensorValue) and isinstance(out, TensorValue)
            and (src.state or produced) and reads.get(node.inputs[0]) == k
            and (src.dtype, tuple(src.dims)) == (out.dtype, tuple(out.dims)))

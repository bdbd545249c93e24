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
    """Symbol `name` takes the live size of dim `dim` of graph input number `input`."""
    name: str
    input: int
    dim: int


@dataclass
class Graph:
    values: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    inputs: list = field(default_factory=list)    # value ids, in delegate-call order
    outputs: list = field(default_factory=list)   # value ids, in delegate-call order
    symbols: list = field(default_factory=list)   # SymbolBinding

    def add_value(self, v: Value) -> int:
        self.values.append(v)
        return len(self.values) - 1

    def tensor(self, vid: int) -> TensorValue:
        v = self.values[vid]
        assert isinstance(v, TensorValue), f"value {vid} is {type(v).__name__}"
        return v


def is_sym(x) -> bool:
    return isinstance(x, SymExpr)

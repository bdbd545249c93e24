"""Integers the host knows at execute: positions and the index ranges built from them.

`input_pos.item()` and what a graph builds from it (`arange(T) + pos`, a 0-d copy of pos, `pos
+ T`) are integers the runner holds before any kernel runs. Running them as kernels would move
int64 tensors through the GPU for nothing. Instead they lower to no IR at all: `.item()` binds
a symbol to an element of the delegate input (SymbolBinding dim < 0), the rest become
expressions over it, and their consumers take them as attributes (a cache write at `pos`,
`narrow(mask, 0, pos, T)`). A symbol that only moves an offset keys no plan
(delegate/runtime/graph_plan.py), so every decode step replays one plan.

Used by the partitioner (such nodes are claimed as folded: inside a partition only with all
their users) and by preprocess (they emit nothing); see `host_only` for an element that a
kernel also reads as a tensor.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Optional, Union

import torch

from delegate.ir import SymExpr
from delegate.ops.export import constant_value, target_name

Expr = Union[int, SymExpr]


@dataclass(frozen=True)
class Element:
    """A 0-d integer tensor: element `index` (flat) of the delegate input `source`."""
    source: torch.fx.Node
    index: int


@dataclass(frozen=True)
class Scalar:
    """A 0-d integer tensor (or a SymInt) holding `expr`."""
    expr: Expr


@dataclass(frozen=True)
class Range:
    """A 1-d integer tensor holding start, start + 1, ..., start + length - 1."""
    start: Expr
    length: Expr


@dataclass(frozen=True)
class Condition:
    """A SymBool: every expression in `nonneg` is >= 0 (`u0 <= 31` is `31 - u0 >= 0`)."""
    nonneg: tuple


@dataclass(frozen=True)
class Assertion:
    """torch._check on a position (aten._assert_scalar): kept as a Graph check."""
    condition: Condition
    message: str


HostValue = Union[Element, Scalar, Range, Condition, Assertion]
# comparison -> [(a - b or b - a, minus)]: a >= b is a - b >= 0, a < b is b - a - 1 >= 0
_COMPARISONS = {operator.ge: [("a-b", 0)], operator.le: [("b-a", 0)],
                operator.gt: [("a-b", 1)], operator.lt: [("b-a", 1)],
                operator.eq: [("a-b", 0), ("b-a", 0)]}
_SYM_OPS = (operator.add, operator.sub, operator.mul, operator.floordiv, operator.neg)
_COPIES = ("dim_order_ops._to_dim_order_copy.default", "aten._to_copy.default",
           "aten.clone.default", "aten.alias_copy.default", "dim_order_ops._clone_dim_order.default")
_INT_DTYPES = (torch.int64, torch.int32)


def value_of(node) -> Optional[HostValue]:
    """What the host knows this node to hold, or None when it needs a kernel."""
    if getattr(node, "op", None) != "call_function":
        return None
    val = node.meta.get("val")
    if isinstance(val, torch.SymInt):
        return _symint(node)
    if isinstance(val, torch.SymBool):
        return _condition(node)
    if target_name(node.target) == "aten._assert_scalar.default":
        cond = value_of(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
        msg = node.args[1] if len(node.args) > 1 else ""
        return Assertion(cond, str(msg)) if isinstance(cond, Condition) else None
    if not isinstance(val, torch.Tensor) or val.dtype not in _INT_DTYPES:
        return None
    name = target_name(node.target)
    if name == "aten.select_copy.int" and val.dim() == 0:
        return _element(node)
    if name == "aten.scalar_tensor.default":
        return Scalar(_expr(node.args[0]))
    if name in _COPIES:
        src = value_of(node.args[0])
        return src if isinstance(src, (Scalar, Range)) else None
    if name in ("aten.arange.start_step", "aten.arange.default", "aten.arange.start"):
        return _arange(node, name)
    if name == "aten.add.Tensor":
        return _add(node)
    return None


def host_only(node) -> bool:
    """value_of(node) is known and every reader takes it as that host value, so the node lowers
    to nothing. An element of a position input that a kernel reads as a tensor (`input_pos[0]
    == 0`, DeltaNet's state reset) runs as the select it is; its `.item()` readers still bind
    their symbol from the input itself."""
    host = value_of(node)
    if host is None:
        return False
    return not isinstance(host, Element) or all(value_of(u) is not None for u in node.users)


def expr_of(arg) -> Optional[Expr]:
    """A SymInt-valued argument (int, SymInt, fx node of one) as an expression."""
    try:
        return _expr(arg)
    except (TypeError, ValueError):
        return None


def _expr(arg) -> Expr:
    if isinstance(arg, torch.fx.Node):
        arg = arg.meta.get("val")
    if isinstance(arg, torch.SymInt):
        e = arg.node.expr
        return int(e) if e.is_number else SymExpr(str(e))
    if isinstance(arg, bool) or not isinstance(arg, int):
        raise TypeError(f"expected an int or SymInt, got {type(arg).__name__}")
    return int(arg)


def _symint(node) -> Optional[HostValue]:
    """`.item()` of a host element, or Python arithmetic on SymInts."""
    if node.target is operator.getitem:
        return None
    if target_name(node.target) == "aten._local_scalar_dense.default":
        src = node.args[0]
        return Scalar(_expr(node)) if isinstance(_element_or_input(src), Element) else None
    if node.target in _SYM_OPS:
        return Scalar(_expr(node))
    return None


def _condition(node) -> Optional[Condition]:
    """A comparison of two SymInts, as expressions that must be >= 0."""
    forms = _COMPARISONS.get(node.target)
    if forms is None or len(node.args) != 2:
        return None
    a, b = (expr_of(x) for x in node.args)
    if a is None or b is None:
        return None
    out = []
    for order, minus in forms:
        big, small = (a, b) if order == "a-b" else (b, a)
        out.append(_sub(_sub(big, small), minus))
    return Condition(tuple(out))


def same_element_symbols(graph) -> dict:
    """Symbol name -> the name of the first `.item()` symbol reading the same input element.
    Each `.item()` gets its own unbacked symbol (older torch exports ExecuTorch's Llama with
    one per cache write), yet at execute all readers of one element hold one value: compare
    expressions through symexpr.renamed(expr, names)."""
    first, names = {}, {}
    for node in graph.nodes:
        if node.op != "call_function" or \
                target_name(node.target) != "aten._local_scalar_dense.default":
            continue
        src, val = local_scalar_source(node), node.meta.get("val")
        if src is not None and isinstance(val, torch.SymInt) and not val.node.expr.is_number:
            name = str(val.node.expr)
            names[name] = first.setdefault(src, name)
    return names


def local_scalar_source(node) -> Optional[Element]:
    """The input element an `aten._local_scalar_dense` node reads, when it reads one."""
    return _element_or_input(node.args[0])


def _element_or_input(src) -> Optional[Element]:
    if _is_int_input(src) and src.meta["val"].numel() == 1:
        return Element(src, 0)
    v = value_of(src) if isinstance(src, torch.fx.Node) else None
    return v if isinstance(v, Element) else None


def _element(node) -> Optional[Element]:
    src, dim, index = node.args[0], node.args[1], node.args[2]
    if not _is_int_input(src) or not isinstance(index, int):
        return None
    shape = tuple(src.meta["val"].shape)
    if len(shape) != 1 or any(not isinstance(s, int) for s in shape):
        return None   # a 1-d position vector of static length, as ExecuTorch's llama passes
    if not -shape[0] <= index < shape[0]:
        return None
    return Element(src, index % shape[0])


def _is_int_input(node) -> bool:
    """A user input of the delegate (not a weight or buffer) holding integers."""
    return (getattr(node, "op", None) == "placeholder" and constant_value(node) is None
            and isinstance(node.meta.get("val"), torch.Tensor)
            and node.meta["val"].dtype in _INT_DTYPES)


def _arange(node, name) -> Optional[Range]:
    args = list(node.args)
    if name == "aten.arange.default":
        args = [0] + args
    start, end = (expr_of(a) for a in args[:2])
    step = args[2] if len(args) > 2 else node.kwargs.get("step", 1)
    if start is None or end is None or step != 1:
        return None
    return Range(start, _sub(end, start))


def _add(node) -> Optional[HostValue]:
    if node.kwargs.get("alpha", 1) != 1 or len(node.args) != 2:
        return None
    a, b = (value_of(x) if isinstance(x, torch.fx.Node) else _literal(x) for x in node.args)
    if isinstance(a, Scalar) and isinstance(b, Range):
        a, b = b, a
    if isinstance(a, Range) and isinstance(b, Scalar):
        return Range(plus(a.start, b.expr), a.length)
    if isinstance(a, Scalar) and isinstance(b, Scalar):
        return Scalar(plus(a.expr, b.expr))
    return None


def _literal(x) -> Optional[Scalar]:
    return Scalar(int(x)) if isinstance(x, int) and not isinstance(x, bool) else None


def plus(a: Expr, b: Expr) -> Expr:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return _simplified(f"({a}) + ({b})")


def _sub(a: Expr, b: Expr) -> Expr:
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    return _simplified(f"({a}) - ({b})")


def _simplified(text: str) -> Expr:
    """(u0 + s0) - u0 -> s0, so a write's length stays the shape symbol it is."""
    import sympy

    e = sympy.sympify(text)
    return int(e) if e.is_number else SymExpr(str(e))

"""Symbolic sizes: expressions such as "s0", "2*s0" or "(s0//2)" over a graph's symbols.

torch.export records dynamic sizes as sympy expressions; the blob stores their text (sympy's
str) and the runtime evaluates them per execute against the symbols bound from the live
inputs. Only integer arithmetic is accepted, through a parsed AST, never eval().

sympy writes floor division as `(a//b)` (torch's FloorDiv) or as `floor(a/b)` (its own, and
what sympify makes of `//`), and `/` is its exact rational division: `floor(s0/64 +
Mod(-s0, 64)/64)`. So `/` yields a Fraction, never a float, floor and ceiling round it
exactly, and a size that does not come out an integer is refused.
"""
from __future__ import annotations

import ast
import functools
import math
import operator
import re
from fractions import Fraction

from delegate.errors import BlobError
from delegate.ir import SymExpr

_NAME = re.compile(r"[A-Za-z_]\w*")


def _true_div(a, b) -> Fraction:
    return Fraction(a) / Fraction(b)


# Python's // and % round towards -inf, as sympy's floor and Mod (the divisor's sign) do.
_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Div: _true_div,
}
# call name -> (function, its number of arguments; None: one or more)
_CALLS = {"Max": (max, None), "Min": (min, None), "max": (max, None), "min": (min, None),
          "Mod": (operator.mod, 2), "FloorDiv": (operator.floordiv, 2),
          "floor": (math.floor, 1), "ceiling": (math.ceil, 1)}
_FORMS = "+ - * / // % over ints and calls of " + ", ".join(_CALLS)


@functools.lru_cache(maxsize=4096)
def _parse(expr: str) -> ast.AST:
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError as e:
        raise BlobError(f"symbolic size: expected an integer expression, got {expr!r}") from e
    for n in ast.walk(tree):
        ok = isinstance(n, (ast.BinOp, ast.UnaryOp, ast.USub, ast.Name, ast.Constant, ast.Call,
                            ast.Load, *_BINOPS))
        if not ok or (isinstance(n, ast.Constant) and type(n.value) is not int):
            raise BlobError(f"symbolic size: expected {_FORMS}, got {expr!r}")
        if isinstance(n, ast.Call):
            _check_call(n, expr)
    return tree


def _check_call(n: ast.Call, expr: str) -> None:
    name = n.func.id if isinstance(n.func, ast.Name) else None
    if name not in _CALLS:
        raise BlobError(f"symbolic size: expected calls of {', '.join(_CALLS)} only, "
                        f"got {expr!r}")
    arity = _CALLS[name][1]
    if n.keywords or not n.args or (arity is not None and len(n.args) != arity):
        want = "one or more" if arity is None else str(arity)
        raise BlobError(f"symbolic size {expr!r}: expected {name}() of {want} argument(s), "
                        f"got {len(n.args)}{' and keywords' if n.keywords else ''}")


def evaluate(expr: str, env: dict) -> int:
    """Value of `expr` with symbols taken from env; BlobError names any unbound symbol, and a
    value that is not an integer (`s0/2` at an odd s0)."""
    value = _eval(_parse(expr), env, expr)
    if isinstance(value, Fraction):
        if value.denominator != 1:
            raise BlobError(f"symbolic size {expr!r}: expected an integer, got {value}")
        return value.numerator
    return int(value)


def renamed(expr, names: dict) -> str:
    """expr's text with each symbol found in `names` renamed to names[symbol] (two symbols
    known to hold one value, as each layer's `.item()` of one position, compared as one)."""
    return _NAME.sub(lambda m: names.get(m.group(0), m.group(0)), str(expr))


def symbols_of(expr: str) -> set:
    return {n.id for n in ast.walk(_parse(expr)) if isinstance(n, ast.Name)} - set(_CALLS)


def _eval(n, env, expr):
    if isinstance(n, ast.Constant):
        return n.value
    if isinstance(n, ast.Name):
        if n.id not in env:
            raise BlobError(f"symbolic size {expr!r}: expected symbol {n.id!r} bound, got none")
        return env[n.id]
    if isinstance(n, ast.UnaryOp):
        return -_eval(n.operand, env, expr)
    if isinstance(n, ast.BinOp):
        return _BINOPS[type(n.op)](_eval(n.left, env, expr), _eval(n.right, env, expr))
    return _CALLS[n.func.id][0](*(_eval(a, env, expr) for a in n.args))


def resolve(x, env: dict):
    """Ints and plain strings pass through; SymExpr are evaluated; lists and dicts
    element-wise."""
    if isinstance(x, SymExpr):
        return evaluate(x, env)
    if isinstance(x, dict):
        return {k: resolve(v, env) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(resolve(e, env) for e in x)
    return x

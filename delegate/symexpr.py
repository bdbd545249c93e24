"""Symbolic sizes: expressions such as "s0", "2*s0" or "(s0//2)" over a graph's symbols.

torch.export records dynamic sizes as sympy expressions; the blob stores their text and the
runtime evaluates them per execute against the symbols bound from the live inputs. Only
integer arithmetic is accepted, through a parsed AST, never eval().
"""
from __future__ import annotations

import ast
import functools
import operator
import re

from delegate.errors import BlobError
from delegate.ir import SymExpr

_NAME = re.compile(r"[A-Za-z_]\w*")

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_CALLS = {"Max": max, "Min": min, "max": max, "min": min, "Mod": operator.mod,
          "FloorDiv": operator.floordiv}


@functools.lru_cache(maxsize=4096)
def _parse(expr: str) -> ast.AST:
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError as e:
        raise BlobError(f"symbolic size: expected an integer expression, got {expr!r}") from e
    for n in ast.walk(tree):
        ok = isinstance(n, (ast.BinOp, ast.UnaryOp, ast.USub, ast.Name, ast.Constant, ast.Call,
                            ast.Load, *_BINOPS))
        if not ok or (isinstance(n, ast.Constant) and not isinstance(n.value, int)):
            raise BlobError(
                f"symbolic size: expected + - * // % Max Min over ints, got {expr!r}"
            )
        if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id in _CALLS):
            raise BlobError(f"symbolic size: expected Max/Min/Mod calls only, got {expr!r}")
    return tree


def evaluate(expr: str, env: dict) -> int:
    """Value of `expr` with symbols taken from env; BlobError names any unbound symbol."""
    return int(_eval(_parse(expr), env, expr))


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
    return _CALLS[n.func.id](*(_eval(a, env, expr) for a in n.args))


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

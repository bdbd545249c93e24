"""The op registry, export half: what the partitioner and preprocess ask of the declarations.

Multi-node patterns (an anchor plus folded producers, lowered to one IR op), the constants of
the program being partitioned or lowered, and lookup by fx target. The runtime never imports
this module's users; the declarations themselves live in delegate/ops/__init__.py.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from delegate.ops import _BY_TARGET, LowerFn, OpDef, _load

_PATTERNS: dict[str, list] = {}     # anchor target name -> [PatternDef]


@dataclass(frozen=True)
class PatternDef:
    """A multi-node pattern rooted at an anchor node, lowered to one IR op `name`.

    When `match(anchor)` holds, the anchor is lowered by `lower` instead of its OpDef and is
    supported when a kernel named `name` exists; the producers it absorbs are folded OpDefs.
    """
    name: str
    anchor: str                    # target name of the anchor node: "aten.linear.default"
    match: Callable                # match(node) -> None when it matches, else why not
    lower: LowerFn
    doc: str = ""


def register_pattern(name: str, anchor: str, match: Callable, lower: LowerFn,
                     doc: str = "") -> PatternDef:
    pat = PatternDef(name, anchor, match, lower, doc)
    _PATTERNS.setdefault(anchor, []).append(pat)
    return pat


def pattern_for(node) -> Optional[PatternDef]:
    """The first registered pattern that matches at this anchor node, or None."""
    _load()
    if getattr(node, "op", None) != "call_function":
        return None
    for pat in _PATTERNS.get(target_name(node.target), ()):
        if pat.match(node) is None:
            return pat
    return None


def pattern_rejections(node) -> list:
    """Why each pattern anchored at this node did not match (for the partitioner's report)."""
    _load()
    if getattr(node, "op", None) != "call_function":
        return []
    return [f"{p.name}: {why}" for p in _PATTERNS.get(target_name(node.target), ())
            if (why := p.match(node)) is not None]


_CONSTANTS: contextvars.ContextVar = contextvars.ContextVar("etwgpu_constants", default=None)


@contextmanager
def program_constants(constants: dict):
    """While partitioning or lowering a program: placeholder name -> its constant tensor.

    Lets a check, match or lower read weight values (a dequantize's zero points, the qdata it
    packs) without holding the ExportedProgram."""
    token = _CONSTANTS.set(constants)
    try:
        yield
    finally:
        _CONSTANTS.reset(token)


def constant_value(node):
    """The tensor behind a parameter / buffer / constant placeholder of the program being
    partitioned or lowered; None for anything else or outside program_constants()."""
    constants = _CONSTANTS.get()
    if constants is None or getattr(node, "op", None) != "placeholder":
        return None
    return constants.get(node.name)


def op_for_target(target) -> Optional[OpDef]:
    """The OpDef whose targets include this fx node target, or None."""
    _load()
    return _BY_TARGET.get(target_name(target))


def through_permutes(x) -> tuple:
    """(base, dims) with x == base.permute(dims), dims [] where they cancel: x read through
    the chain of permute_copy nodes that ends at it, so a kernel that reads through dims needs
    none of their copies (ExecuTorch's custom KV cache transposes k and v to heads-major and
    straight back). Every permute on the way keeps the last dim where it is (the kernels' rows
    stay contiguous), and the base is contiguous in dim order."""
    base, dims = x, None
    while getattr(base, "op", None) == "call_function" and \
            target_name(base.target) == "aten.permute_copy.default":
        src, step = base.args[0], [int(d) % len(base.args[1]) for d in base.args[1]]
        val = src.meta.get("val") if hasattr(src, "meta") else None
        if step[-1] != len(step) - 1 or not isinstance(val, torch.Tensor) or \
                tuple(val.dim_order()) != tuple(range(val.dim())):
            break
        dims = step if dims is None else [step[d] for d in dims]
        base = src
    if dims is None or dims == sorted(dims):
        return base, []
    return base, dims


def target_name(target) -> str:
    """'aten.add.Tensor' for edge ops, ATen overloads and their string names alike."""
    name = getattr(target, "_name", None) or str(target)  # EdgeOpOverload and OpOverload
    name = name.replace("::", ".")
    if name.count(".") == 1:  # "aten.linear" style (default overload)
        name += ".default"
    return name

"""The op registry, runtime half: one declaration per op or op family.

Each family module (delegate/ops/<family>.py) calls `register_op` for the ops it defines. An
OpDef says which edge targets the op covers, which dtypes it accepts, when a node is supported,
how the node lowers to an IR node, and how output shapes follow from input shapes. This module
is what the runtime reads (`get_op(name)`: shapes, dtypes, attribute and arity declarations)
and imports nothing of export; the export half, patterns, program constants and target lookup
for the partitioner and preprocess, is delegate/ops/export.py.

Third parties add ops through the `etwgpu.ops` entry-point group: a module that calls
`register_op` on import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from delegate.errors import DelegateError, UnknownOperatorError, expect
from delegate.ir import SymExpr
from delegate.plugins import import_families

Shape = tuple  # tuple[int, ...]
# infer(input_shapes, attrs) -> output shapes; input_shapes has None for absent optional inputs.
InferFn = Callable[[list, dict], list]
# check(node) -> None when supported, else a short reason the partitioner can report.
CheckFn = Callable[[object], Optional[str]]
# lower(ctx, node) emits IR node(s) through the preprocess LoweringContext.
LowerFn = Callable[[object, object], None]

FLOAT_DTYPES = (torch.float32,)


@dataclass(frozen=True)
class OpDef:
    name: str                      # our op name: IR node op, CPU and WGSL kernel key
    targets: tuple                 # edge op names, as str(node.target): "aten.add.Tensor"
    infer: InferFn
    lower: LowerFn
    dtypes: tuple = FLOAT_DTYPES   # dtypes of the floating tensors the op reads and writes
    check: Optional[CheckFn] = None
    keep: tuple = ()               # ATen ops to keep from decomposition: "aten.linear.default"
    doc: str = ""
    # A folded op runs no kernel: its users absorb it at lowering (a size query becomes a
    # symbolic size, a weight dequantize becomes packed weights), so it is claimed only
    # together with all of its users.
    folded: bool = False
    # Attribute name -> kind (ATTR_KINDS; a trailing "?" also allows None), exactly what the
    # lowering emits; the blob decoder checks each node against it. None: not declared.
    attrs: Optional[dict] = None
    # (inputs, outputs) counts of an IR node, each an int, a (min, max) pair (max None: no
    # upper bound) or None (any count). None: not declared.
    arity: Optional[tuple] = None
    # Output 0 is input 0 updated in place (a cache write): the executors give both values one
    # buffer, and the lowering emits the op only where nothing reads input 0 afterwards.
    in_place: bool = False


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_symint(v) -> bool:
    return _is_int(v) or isinstance(v, SymExpr)


# The attribute kinds a blob can carry, as the decoder sees them (blob._attr).
ATTR_KINDS: dict[str, Callable] = {
    "int": _is_int,
    "float": lambda v: isinstance(v, float),
    "number": lambda v: _is_int(v) or isinstance(v, float),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str) and not isinstance(v, SymExpr),
    "symint": _is_symint,
    "symnumber": lambda v: _is_symint(v) or isinstance(v, float),   # arange bounds, full's value
    "ints": lambda v: isinstance(v, list) and all(_is_int(e) for e in v),
    "symints": lambda v: isinstance(v, list) and all(_is_symint(e) for e in v),
    "floats": lambda v: isinstance(v, list) and all(isinstance(e, float) for e in v),
}


def attrs_mismatch(op: "OpDef", attrs: dict) -> Optional[str]:
    """Why a node's attributes do not match the op's declaration (None when they do, or
    when the op declares none): an unknown, missing or mistyped attribute."""
    if op.attrs is None:
        return None
    unknown = sorted(set(attrs) - set(op.attrs))
    missing = sorted(set(op.attrs) - set(attrs))
    if unknown or missing:
        return f"attributes {sorted(op.attrs)}, got unknown {unknown} and missing {missing}"
    for name, kind in op.attrs.items():
        v = attrs[name]
        if not ((v is None and kind.endswith("?")) or ATTR_KINDS[kind.rstrip("?")](v)):
            return f"attribute {name!r} of kind {kind}, got {type(v).__name__} {v!r}"
    return None


def arity_mismatch(op: "OpDef", n_inputs: int, n_outputs: int) -> Optional[str]:
    """Why a node's input/output counts do not fit the op's declaration, else None."""
    for what, want, got in zip(("inputs", "outputs"), op.arity or (None, None),
                               (n_inputs, n_outputs)):
        if want is None:
            continue
        lo, hi = want if isinstance(want, tuple) else (want, want)
        if not (lo <= got and (hi is None or got <= hi)):
            span = lo if lo == hi else f"at least {lo}" if hi is None else f"{lo} to {hi}"
            return f"{span} {what}, got {got}"
    return None


_OPS: dict[str, OpDef] = {}
_BY_TARGET: dict[str, OpDef] = {}
_loaded = False


def register_op(
    name: str,
    targets: Sequence[str],
    infer: InferFn,
    lower: LowerFn,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    check: Optional[CheckFn] = None,
    keep: Sequence[str] = (),
    doc: str = "",
    folded: bool = False,
    attrs: Optional[dict] = None,
    arity: Optional[tuple] = None,
    in_place: bool = False,
) -> OpDef:
    """Declare an op. Raises DelegateError if the name or a target is already taken, or if
    an attribute kind is unknown."""
    if name in _OPS:
        raise DelegateError(f"op {name!r}: expected a new name, got one already registered")
    for attr, kind in (attrs or {}).items():
        expect(kind.rstrip("?") in ATTR_KINDS, DelegateError, f"op {name!r} attribute {attr!r}",
               f"a kind in {sorted(ATTR_KINDS)}", repr(kind))
    op = OpDef(name, tuple(targets), infer, lower, tuple(dtypes), check, tuple(keep), doc, folded,
               None if attrs is None else dict(attrs), arity, in_place)
    for t in op.targets:
        if t in _BY_TARGET:
            raise DelegateError(
                f"target {t!r}: expected one owner, got {_BY_TARGET[t].name!r} and {name!r}"
            )
    _OPS[name] = op
    for t in op.targets:
        _BY_TARGET[t] = op
    return op


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import_families(__name__, __path__, skip=(), group="etwgpu.ops")


def all_ops() -> dict[str, OpDef]:
    _load()
    return dict(_OPS)


def get_op(name: str) -> OpDef:
    _load()
    try:
        return _OPS[name]
    except KeyError:
        raise UnknownOperatorError(
            f"operator {name!r}: expected one of the registered ops, got an unknown name"
        ) from None


def is_folded(op: OpDef) -> bool:
    return op.folded

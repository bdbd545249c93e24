"""Reductions over any set of dims: sum, mean, amax, amin and var.

Attribute `dims` holds the reduced dims as given (negatives allowed); an empty list means every
dim, as torch reads `dim=[]` and `dim=None`. `keepdim` keeps reduced dims as size 1. var carries
`correction` (Bessel's 1 by default): var = sum((x - mean)^2) / max(0, N - correction).
"""
from __future__ import annotations

import torch

from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops._common import arg, float_inputs, norm_dim, numel, one_input

_ATTRS = {"dims": "ints", "keepdim": "bool"}


def reduced_dims(dims, rank: int, what: str) -> list:
    """The sorted non-negative dims a reduction covers; [] means all of them."""
    if not dims:
        return list(range(rank))
    norm = [norm_dim(d, rank, what, scalar_ok=True) for d in dims]
    expect(len(set(norm)) == len(norm), DelegateError, what, "distinct dims", list(dims))
    return sorted(norm) if rank else []


def _infer(name: str):
    def infer(in_shapes, attrs):
        one_input(in_shapes)
        x = tuple(in_shapes[0])
        dims = reduced_dims(attrs["dims"], len(x), f"{name} dims")
        if name in ("amax", "amin"):
            expect(numel(x[d] for d in dims) > 0, DelegateError, f"{name} over dims {dims}",
                   "a non-empty reduction", f"shape {x}")
        if attrs["keepdim"]:
            return [tuple(1 if d in dims else s for d, s in enumerate(x))]
        return [tuple(s for d, s in enumerate(x) if d not in dims)]

    return infer


def _dims_arg(node) -> list:
    """dim as edge gives it: a list, None, or absent (mean.default / sum.default reduce all)."""
    if str(node.target).startswith(("aten.mean.default", "aten.sum.default")):
        return []
    dims = arg(node, 1, "dim", None)
    return [] if dims is None else [int(d) for d in dims]


def _keepdim_arg(node) -> bool:
    if str(node.target).startswith(("aten.mean.default", "aten.sum.default")):
        return False
    if str(node.target).startswith("aten.var."):
        return bool(node.kwargs.get("keepdim", False))
    return bool(arg(node, 2, "keepdim", False))


def _correction(node) -> float:
    c = node.kwargs.get("correction")
    return 1.0 if c is None else float(c)


def _lower(name: str):
    def lower(ctx, node):
        attrs = {"dims": _dims_arg(node), "keepdim": _keepdim_arg(node)}
        if name == "var":
            attrs["correction"] = _correction(node)
        ctx.emit(name, [ctx.tensor(node.args[0])], [ctx.output(node)], **attrs)

    return lower


def _check(node):
    dtype = node.kwargs.get("dtype")
    if dtype not in (None, torch.float32):
        return f"dtype: expected None or float32, got {dtype}"
    c = node.kwargs.get("correction")
    if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float))):
        return f"correction: expected an int, a float or None, got {type(c).__name__}"
    return float_inputs(node)


for _name, _targets, _doc in (
    ("sum", ("aten.sum.dim_IntList", "aten.sum.default"), "sum over dims ([] = all)"),
    ("mean", ("aten.mean.dim", "aten.mean.default"), "mean over dims ([] = all)"),
    ("amax", ("aten.amax.default",), "max over dims ([] = all); NaN propagates"),
    ("amin", ("aten.amin.default",), "min over dims ([] = all); NaN propagates"),
):
    register_op(_name, _targets, _infer(_name), _lower(_name), check=_check, doc=_doc,
                attrs=dict(_ATTRS), arity=(1, 1))

register_op("var", ("aten.var.correction",), _infer("var"), _lower("var"), check=_check,
            doc="sum((x - mean)^2) / max(0, N - correction) over dims ([] = all)",
            attrs={**_ATTRS, "correction": "float"}, arity=(1, 1))

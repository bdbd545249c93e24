"""Reductions over any set of dims: sum, mean, amax, amin and var; and argmax, argmin and
median, which also give (or only give) an int64 index.

Attribute `dims` holds the reduced dims as given (negatives allowed); an empty list means every
dim, as torch reads `dim=[]` and `dim=None`. `keepdim` keeps reduced dims as size 1. var carries
`correction` (Bessel's 1 by default): var = sum((x - mean)^2) / max(0, N - correction).
sum and mean with `dtype=torch.float32` over an integer or bool input cast it first (as torch
does), a cast node before the reduction.

argmax / argmin reduce one dim or, dims [], the flattened input (the index into it); ties give
the first index, and a NaN wins (the first NaN's index), as torch. median (aten.median.default:
the value over all dims; aten.median.dim: values and indices along one dim, `indices` true) is
the lower of the two middle values; NaN anywhere in a row gives NaN and the first NaN's index.
Where several entries equal the median, which one's index is given is unspecified, as torch
says of its own (the CPU kernel gives torch's, the WGSL kernel the first).
"""
from __future__ import annotations

import torch

from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops._common import arg, contiguous_inputs, float_inputs, norm_dim, numel, one_input

_ATTRS = {"dims": "ints", "keepdim": "bool"}
_INDEXED_OPS = ("argmax", "argmin", "median")   # over one dim or all: an index is into it


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
        if name in _INDEXED_OPS:
            expect(len(attrs["dims"]) <= 1, DelegateError, f"{name} dims",
                   "one dim, or [] for all", attrs["dims"])
        if name in ("amax", "amin", *_INDEXED_OPS):
            expect(numel(x[d] for d in dims) > 0, DelegateError, f"{name} over dims {dims}",
                   "a non-empty reduction", f"shape {x}")
        if attrs["keepdim"]:
            out = tuple(1 if d in dims else s for d, s in enumerate(x))
        else:
            out = tuple(s for d, s in enumerate(x) if d not in dims)
        return [out, out] if attrs.get("indices") else [out]

    return infer


# Targets that take no dim (they reduce all dims, keepdim false).
_ALL_DIMS = ("aten.mean.default", "aten.sum.default", "aten.median.default")


def _dims_arg(node) -> list:
    """dim as edge gives it: a list, one int (argmax, median.dim), None, or absent."""
    if str(node.target).startswith(_ALL_DIMS):
        return []
    dims = arg(node, 1, "dim", None)
    if dims is None:
        return []
    return [int(d) for d in dims] if isinstance(dims, (list, tuple)) else [int(dims)]


def _keepdim_arg(node) -> bool:
    if str(node.target).startswith(_ALL_DIMS):
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
        x, val = ctx.tensor(node.args[0]), node.args[0].meta["val"]
        if val.dtype != torch.float32:   # sum / mean with dtype=float32 (_check)
            cast = ctx.new_value(torch.float32, ctx.dims(val.shape))
            ctx.emit("cast", [x], [cast], dtype="float32")
            x = cast
        if name == "median":
            attrs["indices"] = isinstance(node.meta["val"], (tuple, list))
            outs = ctx.outputs(node) if attrs["indices"] else [ctx.output(node)]
        else:
            outs = [ctx.output(node)]
        ctx.emit(name, [x], outs, **attrs)

    return lower


# Inputs sum and mean read through a cast to float32 when `dtype=torch.float32` is given.
_CAST_INPUTS = (torch.int32, torch.int64, torch.bool)


def _check(node):
    dtype = node.kwargs.get("dtype")
    if dtype not in (None, torch.float32):
        return f"dtype: expected None or float32, got {dtype}"
    c = node.kwargs.get("correction")
    if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float))):
        return f"correction: expected an int, a float or None, got {type(c).__name__}"
    if dtype == torch.float32 and node.args[0].meta["val"].dtype in _CAST_INPUTS:
        return contiguous_inputs(node)
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

_INDEXED = (torch.float32, torch.int64)   # a float32 input, int64 indices out
for _name, _doc in (
    ("argmax", "index of the max over one dim or, dims [], the flattened input; first on ties"),
    ("argmin", "index of the min over one dim or, dims [], the flattened input; first on ties"),
):
    register_op(_name, (f"aten.{_name}.default",), _infer(_name), _lower(_name), dtypes=_INDEXED,
                check=float_inputs, doc=_doc, attrs=dict(_ATTRS), arity=(1, 1))

register_op("median", ("aten.median.default", "aten.median.dim"), _infer("median"),
            _lower("median"), dtypes=_INDEXED, check=float_inputs,
            doc="lower middle value over dims ([] = all); `indices`: also its int64 index",
            attrs={**_ATTRS, "indices": "bool"}, arity=(1, (1, 2)))

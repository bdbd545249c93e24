"""Normalizations over the trailing `normalized_shape` dims: rms_norm and layer_norm.

rms_norm is kept whole from decomposition. layer_norm covers both the kept aten.layer_norm
(one output) and edge's native_layer_norm (output, mean, rstd); attribute `stats` says which.
"""
from __future__ import annotations

from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops._common import arg, float_dtypes, one_input


def _check_normalized(x, normalized, params) -> int:
    """Index of the first normalized dim; raises unless x ends in normalized_shape."""
    n = len(normalized)
    expect(0 < n <= len(x) and tuple(x[len(x) - n:]) == tuple(normalized), DelegateError,
           "normalized_shape", f"the trailing dims of {tuple(x)}", tuple(normalized))
    for what, p in params:
        if p is not None:
            expect(tuple(p) == tuple(normalized), DelegateError, what, tuple(normalized), tuple(p))
    return len(x) - n


def _optional(in_shapes, i: int):
    return in_shapes[i] if len(in_shapes) > i else None


def _infer_rms_norm(in_shapes, attrs):
    one_input(in_shapes)
    params = [("rms_norm weight", _optional(in_shapes, 1))]
    _check_normalized(in_shapes[0], attrs["normalized_shape"], params)
    return [tuple(in_shapes[0])]


def _infer_layer_norm(in_shapes, attrs):
    one_input(in_shapes)
    x = tuple(in_shapes[0])
    params = [("layer_norm weight", _optional(in_shapes, 1)),
              ("layer_norm bias", _optional(in_shapes, 2))]
    axis = _check_normalized(x, attrs["normalized_shape"], params)
    if not attrs.get("stats"):
        return [x]
    stat = x[:axis] + (1,) * (len(x) - axis)
    return [x, stat, stat]


def _eps(value):
    return None if value is None else float(value)


def _lower_rms_norm(ctx, node):
    ctx.emit("rms_norm", [ctx.tensor(node.args[0]), ctx.optional_tensor(arg(node, 2, "weight"))],
             [ctx.output(node)], normalized_shape=ctx.dims(node.args[1]),
             eps=_eps(arg(node, 3, "eps")))


def _lower_layer_norm(ctx, node):
    native = isinstance(node.meta["val"], (tuple, list))
    ins = [ctx.tensor(node.args[0]), ctx.optional_tensor(arg(node, 2, "weight")),
           ctx.optional_tensor(arg(node, 3, "bias"))]
    outs = ctx.outputs(node) if native else [ctx.output(node)]
    ctx.emit("layer_norm", ins, outs, normalized_shape=ctx.dims(node.args[1]),
             eps=float(arg(node, 4, "eps", 1e-5)), stats=native)


register_op("rms_norm", ("aten.rms_norm.default",), _infer_rms_norm, _lower_rms_norm,
            check=float_dtypes, keep=("aten.rms_norm.default",),
            doc="x / sqrt(mean(x^2) + eps) * w; eps None means finfo(float32).eps",
            attrs={"normalized_shape": "symints", "eps": "float?"}, arity=(2, 1))
register_op("layer_norm", ("aten.layer_norm.default", "aten.native_layer_norm.default"),
            _infer_layer_norm, _lower_layer_norm, check=float_dtypes,
            keep=("aten.layer_norm.default",),
            doc="(x - mean) / sqrt(var + eps) * w + b; native form also returns mean, rstd",
            attrs={"normalized_shape": "symints", "eps": "float", "stats": "bool"},
            arity=(3, (1, 3)))

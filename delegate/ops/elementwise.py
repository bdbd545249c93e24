"""Elementwise ops: add, sub, mul, div (tensor or scalar operand, broadcasting), and the unary
activations and transcendentals a transformer uses (log1p: the softplus of Qwen3.5's DeltaNet).
Comparisons and where, which read and write more than float32, are delegate/ops/comparison.py.

A binary op's IR node has inputs [a, b] with b = -1 when the operand is a number; the number
then travels as attribute `other`. add/sub carry `alpha` (out = a + alpha * b).

Integers: add, sub, mul and neg also run on int32 and int64 (a transformer's position and mask
arithmetic), with torch's promotion: integer operands (bool among them) give an integer result,
computed in integers with `other` and `alpha` kept ints; any float operand, and div always,
give float32. The WebGPU executor holds int64 as i32, so integer results wrap at 32 bits
there: values stay in range (as for every int64 tensor on WebGPU).
"""
from __future__ import annotations

import torch

from delegate.ops import register_op
from delegate.ops._common import (arg, float_dtypes, float_inputs, four_byte_inputs,
                                  infer_binary, is_number, one_input)

_GELU_APPROX = ("none", "tanh")
INT_RESULTS = (torch.float32, torch.int32, torch.int64)   # add, sub, mul, neg
I32_RANGE = (-(1 << 31), (1 << 31) - 1)   # an integer scalar's range: WebGPU computes in i32


def infer_unary(in_shapes, attrs):
    one_input(in_shapes)
    return [tuple(in_shapes[0])]


def _binary_lower(name: str, with_alpha: bool):
    def lower(ctx, node):
        other = node.args[1]
        tensor = isinstance(other, torch.fx.Node)
        # scalars in the result's type: float for a float result (as before ints existed),
        # int for an integer one, so integer arithmetic stays exact
        number = float if node.meta["val"].dtype.is_floating_point else int
        attrs = {"other": None if tensor else number(other)}
        if with_alpha:
            attrs["alpha"] = number(arg(node, 2, "alpha", 1))
        ins = [ctx.tensor(node.args[0]), ctx.tensor(other) if tensor else -1]
        ctx.emit(name, ins, [ctx.output(node)], **attrs)

    return lower


def _binary_check(node):
    other, alpha = node.args[1], arg(node, 2, "alpha", 1)
    if not isinstance(other, torch.fx.Node) and not is_number(other):
        return f"scalar operand: expected an int or float, got {type(other).__name__}"
    if "alpha" in node.kwargs or len(node.args) > 2:
        if not is_number(alpha):
            return f"alpha: expected an int or float, got {type(alpha).__name__}"
    mode = node.kwargs.get("rounding_mode")
    if mode is not None:
        # integer floor/trunc division raises on a zero divisor, which a GPU kernel cannot,
        # and torch's float floor division is not floor(a / b): both stay outside
        return f"rounding_mode: expected None (true division), got {mode!r}"
    return _integer_scalars(node, other, alpha) or four_byte_inputs(node)


def _integer_scalars(node, *numbers) -> "str | None":
    """Reason unless an integer result's scalars fit the i32 the WebGPU kernels compute in."""
    if node.meta["val"].dtype.is_floating_point:
        return None
    for v in numbers:
        why = i32_scalar_reason(v)
        if why:
            return why
    return None


def i32_scalar_reason(v) -> "str | None":
    """Reason unless an int scalar fits in i32, what WebGPU computes integers in (bitwise too)."""
    lo, hi = I32_RANGE
    if isinstance(v, int) and not lo <= v <= hi:
        return f"integer scalar: expected one in [{lo}, {hi}] (WebGPU runs i32), got {v}"
    return None


def _unary_lower(name: str, attrs: dict = None):
    """attrs: attribute name -> (positional index, kwarg name, default)."""
    attrs = attrs or {}

    def lower(ctx, node):
        values = {k: arg(node, i, kw, d) for k, (i, kw, d) in attrs.items()}
        ctx.emit(name, [ctx.tensor(node.args[0])], [ctx.output(node)], **values)

    return lower


def _check_gelu(node):
    approx = arg(node, 1, "approximate", "none")
    if approx not in _GELU_APPROX:
        return f"approximate: expected one of {_GELU_APPROX}, got {approx!r}"
    return float_inputs(node)


def _check_pow(node):
    exponent = node.args[1]
    if not is_number(exponent):
        return f"exponent: expected an int or float, got {type(exponent).__name__}"
    return float_inputs(node)


for _name, _targets, _alpha in (
    ("add", ("aten.add.Tensor", "aten.add.Scalar"), True),
    ("sub", ("aten.sub.Tensor", "aten.sub.Scalar"), True),
    ("mul", ("aten.mul.Tensor", "aten.mul.Scalar"), False),
    ("div", ("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode",
             "aten.div.Scalar_mode"), False),
):
    register_op(_name, _targets, infer_binary, _binary_lower(_name, _alpha),
                dtypes=(torch.float32,) if _name == "div" else INT_RESULTS, check=_binary_check,
                attrs={"other": "number?", **({"alpha": "number"} if _alpha else {})},
                arity=(2, 1),
                doc=f"{_name} with broadcasting; scalar operand as attribute `other`"
                    + (", times alpha" if _alpha else "")
                    + ("; integers divide as floats" if _name == "div" else
                       "; integers stay integers, with float operands as torch promotes"))

register_op("neg", ("aten.neg.default",), infer_unary, _unary_lower("neg"), dtypes=INT_RESULTS,
            check=four_byte_inputs, doc="-x (integers wrap as torch's do)", attrs={},
            arity=(1, 1))
for _name, _doc in (
    ("exp", "e^x"), ("sigmoid", "1 / (1 + e^-x)"), ("relu", "max(x, 0)"),
    ("tanh", "tanh(x)"), ("rsqrt", "1 / sqrt(x)"), ("abs", "|x|"), ("sqrt", "sqrt(x)"),
    ("log", "ln(x)"), ("log1p", "ln(1 + x), accurate for small x"), ("ceil", "ceil(x)"),
    ("floor", "floor(x)"), ("sin", "sin(x)"), ("cos", "cos(x)"),
):
    register_op(_name, (f"aten.{_name}.default",), infer_unary, _unary_lower(_name),
                check=float_inputs, doc=_doc, attrs={}, arity=(1, 1))

# silu is kept whole so a SwiGLU gate stays one op (edge would split it into sigmoid * x)
register_op("silu", ("aten.silu.default",), infer_unary, _unary_lower("silu"),
            check=float_dtypes, keep=("aten.silu.default",), doc="x * sigmoid(x)",
            attrs={}, arity=(1, 1))
# kept whole: edge would decompose each into add, clamp, mul and div with lifted constants
register_op("hardswish", ("aten.hardswish.default",), infer_unary, _unary_lower("hardswish"),
            check=float_dtypes, keep=("aten.hardswish.default",),
            doc="x * clamp(x + 3, 0, 6) / 6", attrs={}, arity=(1, 1))
register_op("hardsigmoid", ("aten.hardsigmoid.default",), infer_unary,
            _unary_lower("hardsigmoid"), check=float_dtypes,
            keep=("aten.hardsigmoid.default",), doc="clamp(x + 3, 0, 6) / 6", attrs={},
            arity=(1, 1))
register_op("gelu", ("aten.gelu.default",), infer_unary,
            _unary_lower("gelu", {"approximate": (1, "approximate", "none")}), check=_check_gelu,
            doc="gelu, exact (erf) or tanh approximation", attrs={"approximate": "str"},
            arity=(1, 1))
register_op("pow", ("aten.pow.Tensor_Scalar",), infer_unary,
            _unary_lower("pow", {"exponent": (1, "exponent", None)}), check=_check_pow,
            doc="x ** exponent for a scalar exponent", attrs={"exponent": "number"},
            arity=(1, 1))


def _bound(x):
    return None if x is None else float(x)


def _clamp_bounds(node):
    """(min, max) of clamp, or of hardtanh (defaults -1, 1), as given positionally or by name."""
    if "hardtanh" in str(node.target):
        return arg(node, 1, "min_val", -1.0), arg(node, 2, "max_val", 1.0)
    return arg(node, 1, "min", None), arg(node, 2, "max", None)


def _check_clamp(node):
    lo, hi = _clamp_bounds(node)
    for what, v in (("min", lo), ("max", hi)):
        if v is not None and not is_number(v):
            return f"{what}: expected an int, a float or None, got {type(v).__name__}"
    if lo is None and hi is None:
        return "bounds: expected min or max, got neither"
    return float_inputs(node)


def _lower_clamp(ctx, node):
    lo, hi = _clamp_bounds(node)
    ctx.emit("clamp", [ctx.tensor(node.args[0])], [ctx.output(node)], min=_bound(lo),
             max=_bound(hi))


def _check_numbers(*params):
    """Reason unless each (index, name) argument, when given, is an int or float."""
    def check(node):
        for i, name in params:
            v = arg(node, i, name, 0.0)
            if not is_number(v):
                return f"{name}: expected an int or float, got {type(v).__name__}"
        return float_inputs(node)

    return check


# hardtanh is clamp with other defaults (relu6 reaches edge as hardtanh(0, 6)).
register_op("clamp", ("aten.clamp.default", "aten.hardtanh.default"), infer_unary,
            _lower_clamp, check=_check_clamp, doc="min(max(x, min), max); either bound optional",
            attrs={"min": "float?", "max": "float?"}, arity=(1, 1))
register_op("leaky_relu", ("aten.leaky_relu.default",), infer_unary,
            _unary_lower("leaky_relu", {"negative_slope": (1, "negative_slope", 0.01)}),
            check=_check_numbers((1, "negative_slope")), doc="x if x > 0 else slope * x",
            attrs={"negative_slope": "number"}, arity=(1, 1))
register_op("elu", ("aten.elu.default",), infer_unary,
            _unary_lower("elu", {"alpha": (1, "alpha", 1.0), "scale": (2, "scale", 1.0),
                                 "input_scale": (3, "input_scale", 1.0)}),
            check=_check_numbers((1, "alpha"), (2, "scale"), (3, "input_scale")),
            doc="scale * (x if x > 0 else alpha * (e^(input_scale * x) - 1))",
            attrs={"alpha": "number", "scale": "number", "input_scale": "number"}, arity=(1, 1))

"""Matrix products: linear (kept whole from decomposition), mm, bmm and addmm; and 1-D / 2-D
convolution (plain or transposed), a matrix product over sliding windows.

linear reads its weight as torch stores it, [N, K], so no permute_copy of the weight is needed;
the decomposed form (permute_copy + addmm / mm) lowers through shape's permute and these ops.
"""
from __future__ import annotations

from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops._common import arg, broadcast, float_dtypes, float_inputs, one_input


def _rank(shape, want: int, what: str) -> None:
    expect(len(shape) == want, DelegateError, f"{what} rank", want, f"{len(shape)} {tuple(shape)}")


def _inner(k_a: int, k_b: int, a, b) -> None:
    expect(k_a == k_b, DelegateError, "matmul inner dims", f"equal sizes for {tuple(a)} @ {tuple(b)}",
           f"{k_a} and {k_b}")


def _infer_linear(in_shapes, attrs):
    one_input(in_shapes, 2)
    x, w = in_shapes[0], in_shapes[1]
    bias = in_shapes[2] if len(in_shapes) > 2 else None
    expect(len(x) >= 1, DelegateError, "linear input rank", ">= 1", len(x))
    _rank(w, 2, "linear weight")
    _inner(x[-1], w[1], x, w)
    out = tuple(x[:-1]) + (w[0],)
    if bias is not None:
        expect(broadcast(out, bias) == out, DelegateError, "linear bias", f"broadcastable to {out}",
               tuple(bias))
    return [out]


def _infer_mm(in_shapes, attrs):
    one_input(in_shapes, 2)
    a, b = in_shapes[0], in_shapes[1]
    _rank(a, 2, "mm self")
    _rank(b, 2, "mm mat2")
    _inner(a[1], b[0], a, b)
    return [(a[0], b[1])]


def _infer_bmm(in_shapes, attrs):
    one_input(in_shapes, 2)
    a, b = in_shapes[0], in_shapes[1]
    _rank(a, 3, "bmm self")
    _rank(b, 3, "bmm mat2")
    expect(a[0] == b[0], DelegateError, "bmm batch", a[0], b[0])
    _inner(a[2], b[1], a, b)
    return [(a[0], a[1], b[2])]


def _infer_addmm(in_shapes, attrs):
    one_input(in_shapes, 3)
    out = _infer_mm(in_shapes[1:3], attrs)[0]
    expect(broadcast(out, in_shapes[0]) == out, DelegateError, "addmm bias",
           f"broadcastable to {out}", tuple(in_shapes[0]))
    return [out]


def _lower_linear(ctx, node):
    bias = arg(node, 2, "bias")
    ctx.emit("linear", [ctx.tensor(node.args[0]), ctx.tensor(node.args[1]),
                        ctx.optional_tensor(bias)], [ctx.output(node)])


def _lower_mm(name):
    def lower(ctx, node):
        ctx.emit(name, [ctx.tensor(node.args[0]), ctx.tensor(node.args[1])], [ctx.output(node)])

    return lower


def _lower_addmm(ctx, node):
    ins = [ctx.tensor(a) for a in node.args[:3]]
    ctx.emit("addmm", ins, [ctx.output(node)], beta=float(arg(node, 3, "beta", 1)),
             alpha=float(arg(node, 4, "alpha", 1)))


def _check_addmm(node):
    for i, name in ((3, "beta"), (4, "alpha")):
        v = arg(node, i, name, 1)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"{name}: expected an int or float, got {type(v).__name__}"
    return float_inputs(node)


register_op("linear", ("aten.linear.default",), _infer_linear, _lower_linear,
            check=float_dtypes, keep=("aten.linear.default",), doc="x @ W^T + b, W stored [N, K]; bias optional",
            attrs={}, arity=(3, 1))
register_op("mm", ("aten.mm.default",), _infer_mm, _lower_mm("mm"), check=float_inputs,
            doc="[M, K] @ [K, N]", attrs={}, arity=(2, 1))
register_op("bmm", ("aten.bmm.default",), _infer_bmm, _lower_mm("bmm"), check=float_inputs,
            doc="[B, M, K] @ [B, K, N]", attrs={}, arity=(2, 1))
register_op("addmm", ("aten.addmm.default",), _infer_addmm, _lower_addmm, check=_check_addmm,
            doc="beta * bias + alpha * (a @ b), bias broadcast to [M, N]",
            attrs={"beta": "float", "alpha": "float"}, arity=(3, 1))


_CONV_ATTRS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


def _conv_params(node) -> dict:
    return dict(zip(_CONV_ATTRS, node.args[3:9]))


def conv_attrs(node) -> dict:
    """The IR attributes of an aten.convolution node (lists, not tuples)."""
    return {k: (list(v) if isinstance(v, (list, tuple)) else v)
            for k, v in _conv_params(node).items()}


def _infer_conv(in_shapes, attrs):
    """out = floor((in + 2p - d(k-1) - 1) / s) + 1; transposed: (in-1)s - 2p + d(k-1) + op + 1."""
    one_input(in_shapes, 2)
    x, w = in_shapes[0], in_shapes[1]
    spatial = len(x) - 2
    expect(spatial in (1, 2) and len(w) == len(x), DelegateError, "convolution input/weight rank",
           "3 or 4, equal", f"{len(x)} and {len(w)}")
    g, transposed = attrs["groups"], attrs["transposed"]
    c_in = w[0] if transposed else w[1] * g
    expect(x[1] == c_in, DelegateError, "convolution input channels", c_in, x[1])
    c_out = w[1] * g if transposed else w[0]
    dims = []
    for i in range(spatial):
        s, p, d, k = attrs["stride"][i], attrs["padding"][i], attrs["dilation"][i], w[2 + i]
        if transposed:
            n = (x[2 + i] - 1) * s - 2 * p + d * (k - 1) + attrs["output_padding"][i] + 1
        else:
            n = (x[2 + i] + 2 * p - d * (k - 1) - 1) // s + 1
        expect(n >= 1, DelegateError, "convolution output size", ">= 1", n)
        dims.append(n)
    return [(x[0], c_out, *dims)]


def _check_conv(node):
    x = node.args[0].meta["val"]
    if x.dim() not in (3, 4):
        return f"input rank: expected 3 or 4 (1-D or 2-D convolution), got {x.dim()}"
    params = _conv_params(node)
    for name in ("stride", "padding", "dilation", "output_padding"):
        if not all(isinstance(v, int) for v in params[name]):
            return f"{name}: expected ints, got {params[name]}"
    if not isinstance(params["groups"], int):
        return f"groups: expected an int, got {params['groups']}"
    return float_inputs(node)


def _lower_conv(ctx, node):
    ins = [ctx.tensor(node.args[0]), ctx.tensor(node.args[1]), ctx.optional_tensor(node.args[2])]
    ctx.emit("convolution", ins, [ctx.output(node)], **conv_attrs(node))


register_op("convolution", ("aten.convolution.default",), _infer_conv, _lower_conv,
            check=_check_conv, doc="1-D / 2-D convolution, plain or transposed, grouped",
            attrs={"stride": "ints", "padding": "ints", "dilation": "ints", "transposed": "bool",
                   "output_padding": "ints", "groups": "int"}, arity=(3, 1))

"""batch_norm (inference): edge's `_native_batch_norm_legit_no_training`, a per-channel affine
map over dim 1 with the running statistics,

    y = (x - mean[c]) * rsqrt(var[c] + eps) * w[c] + b[c]      (w, b optional)

The edge node returns (y, save_mean, save_invstd); only y is ever read in inference, so the
IR node has the one output. Where a constant convolution feeds it, delegate/passes folds it
into the convolution's weights instead.
"""
from __future__ import annotations

import operator

from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops._common import arg, float_inputs, one_input, only_output0


def _infer_batch_norm(in_shapes, attrs):
    one_input(in_shapes)
    x = tuple(in_shapes[0])
    expect(len(x) >= 2, DelegateError, "batch_norm input rank", ">= 2 (N, C, ...)", len(x))
    names = ("weight", "bias", "running_mean", "running_var")
    for name, s in zip(names, in_shapes[1:5]):
        if s is not None:
            expect(tuple(s) == (x[1],), DelegateError, f"batch_norm {name}", (x[1],), tuple(s))
    expect(len(in_shapes) == 5 and in_shapes[3] is not None and in_shapes[4] is not None,
           DelegateError, "batch_norm inputs", "x, weight?, bias?, running_mean, running_var",
           in_shapes)
    return [x]


def _check_batch_norm(node):
    if only_output0(node) is None:
        return "outputs: expected only output 0 (y) read, got " + \
            str([u.args[1] if u.target is operator.getitem else u.name for u in node.users])
    if node.args[0].meta["val"].dim() < 2:
        return f"input rank: expected >= 2 (N, C, ...), got {node.args[0].meta['val'].dim()}"
    return float_inputs(node)


def _lower_batch_norm(ctx, node):
    ins = [ctx.tensor(node.args[0]), ctx.optional_tensor(node.args[1]),
           ctx.optional_tensor(node.args[2]), ctx.tensor(node.args[3]), ctx.tensor(node.args[4])]
    ctx.emit("batch_norm", ins, [ctx.output(only_output0(node))],
             eps=float(arg(node, 6, "eps", 1e-5)))


register_op("batch_norm", ("aten._native_batch_norm_legit_no_training.default",),
            _infer_batch_norm, _lower_batch_norm, check=_check_batch_norm,
            doc="inference batch norm over dim 1: (x - mean) * rsqrt(var + eps) * w + b",
            attrs={"eps": "float"}, arity=(5, 1))

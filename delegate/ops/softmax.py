"""Softmax along one dim (edge's aten._softmax)."""
from __future__ import annotations

from delegate.ops import register_op
from delegate.ops._common import float_inputs, norm_dim, one_input


def _infer_softmax(in_shapes, attrs):
    one_input(in_shapes)
    norm_dim(attrs["dim"], len(in_shapes[0]), "softmax dim", scalar_ok=True)
    return [tuple(in_shapes[0])]


def _lower_softmax(ctx, node):
    rank = node.args[0].meta["val"].dim()
    ctx.emit("softmax", [ctx.tensor(node.args[0])], [ctx.output(node)],
             dim=norm_dim(node.args[1], rank, "softmax dim", scalar_ok=True))


def _check_softmax(node):
    if len(node.args) > 2 and node.args[2]:
        return "half_to_float: expected False, got True"
    return float_inputs(node)


register_op("softmax", ("aten._softmax.default",), _infer_softmax, _lower_softmax,
            check=_check_softmax, doc="exp(x - max) / sum(exp(x - max)) along dim",
            attrs={"dim": "int"}, arity=(1, 1))

"""Comparisons and where: eq, ne, lt, le, gt, ge (tensor or scalar operand, broadcasting) give
bool; where(condition, a, b) picks between two tensors of one dtype, broadcasting all three.

Operands may be float32 or integers (int64 too: the WebGPU executor holds it as i32) or bool.
As in torch, an integer tensor against a float operand compares as float, and NaN compares
unequal to everything (ne true, the others false). A comparison's IR node has inputs [a, b]
with b = -1 when the operand is a number; the number travels as attribute `other`, an int
kept an int so integer comparisons stay exact.

Qwen3.5's DeltaNet reaches these through `input_pos[0] == 0` (its state reset) and softplus,
which edge decomposes into where(x > 20, x, log1p(exp(x))).
"""
from __future__ import annotations

import torch

from delegate.ops import register_op
from delegate.ops._common import (FOUR_BYTE, broadcast, four_byte_inputs, infer_binary,
                                  is_number, one_input)

COMPARISONS = {"eq": "a == b", "ne": "a != b", "lt": "a < b", "le": "a <= b", "gt": "a > b",
               "ge": "a >= b"}


def _check_comparison(node):
    other = node.args[1]
    if not isinstance(other, torch.fx.Node) and not is_number(other):
        return f"scalar operand: expected an int or float, got {type(other).__name__}"
    return four_byte_inputs(node)


def _comparison_lower(name: str):
    def lower(ctx, node):
        other = node.args[1]
        tensor = isinstance(other, torch.fx.Node)
        ins = [ctx.tensor(node.args[0]), ctx.tensor(other) if tensor else -1]
        ctx.emit(name, ins, [ctx.output(node)], other=None if tensor else other)

    return lower


for _name, _doc in COMPARISONS.items():
    register_op(_name, (f"aten.{_name}.Tensor", f"aten.{_name}.Scalar"), infer_binary,
                _comparison_lower(_name), dtypes=FOUR_BYTE, check=_check_comparison,
                attrs={"other": "number?"}, arity=(2, 1),
                doc=f"bool {_doc} with broadcasting; scalar operand as attribute `other`")


def _infer_where(in_shapes, attrs):
    one_input(in_shapes, 3)
    return [broadcast(*in_shapes[:3])]


def _check_where(node):
    cond, a, b = (x.meta["val"] for x in node.args[:3])
    if cond.dtype != torch.bool:
        return f"condition dtype: expected torch.bool, got {cond.dtype}"
    if not a.dtype == b.dtype == node.meta["val"].dtype:
        return f"operand dtypes {a.dtype} / {b.dtype}: expected one dtype (no promotion)"
    return four_byte_inputs(node)


def _lower_where(ctx, node):
    ctx.emit("where", [ctx.tensor(x) for x in node.args[:3]], [ctx.output(node)])


register_op("where", ("aten.where.self",), _infer_where, _lower_where, dtypes=FOUR_BYTE,
            check=_check_where, attrs={}, arity=(3, 1),
            doc="condition ? a : b, the three broadcast; a and b of one dtype")

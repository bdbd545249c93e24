"""Bitwise and logical ops: bitwise_and, bitwise_or, bitwise_xor (tensor or scalar operand,
broadcasting) and bitwise_not on bool and integers; logical_and, logical_or, logical_xor and
logical_not on any 4-byte dtype, giving bool.

Bitwise ops promote as torch does: bool with bool gives bool, with an integer an integer; torch
refuses float operands, and so do we. Logical ops read each operand as x != 0 (a float NaN is
true, -0 false). HF transformers' Llama, Qwen3 and GPT-2 build their attention mask with
bitwise_and of a causal and a padding mask.

A binary op's IR node has inputs [a, b] with b = -1 when the operand is a scalar, which then
travels as attribute `other`, an int: a bool scalar as 0 / 1, since and, or and xor of 0 / 1
operands give the same bits whether they are read as bool or as integers. Edge's
Scalar_Tensor form (scalar first) lowers with its operands swapped: the three commute.
"""
from __future__ import annotations

import torch

from delegate.ops import register_op
from delegate.ops._common import FOUR_BYTE, four_byte_inputs, infer_binary, tensor_args
from delegate.ops.elementwise import i32_scalar_reason, infer_unary

BITWISE = {"bitwise_and": "a & b", "bitwise_or": "a | b", "bitwise_xor": "a ^ b"}
LOGICAL = {"logical_and": "a and b", "logical_or": "a or b", "logical_xor": "a xor b"}
BITWISE_DTYPES = (torch.int32, torch.int64, torch.bool)


def _operands(node) -> tuple:
    """(tensor, other) of a binary bitwise op in any edge form (Scalar_Tensor: scalar first)."""
    a, b = node.args[:2]
    return (b, a) if not isinstance(a, torch.fx.Node) else (a, b)


def _integer_inputs(node) -> "str | None":
    """Reason unless every tensor argument is bool or an integer (torch refuses floats)."""
    for a in tensor_args(node):
        if a.meta["val"].dtype not in BITWISE_DTYPES:
            return f"input {a.name}: expected one of {BITWISE_DTYPES}, got {a.meta['val'].dtype}"
    return None


def _check_bitwise(node):
    _, other = _operands(node)
    if not isinstance(other, (torch.fx.Node, int)):   # a bool is an int
        return f"scalar operand: expected an int or bool, got {type(other).__name__}"
    return i32_scalar_reason(other) or _integer_inputs(node) or four_byte_inputs(node)


def _check_bitwise_not(node):
    return _integer_inputs(node) or four_byte_inputs(node)


def _lower_binary(name: str):
    def lower(ctx, node):
        a, other = _operands(node)
        tensor = isinstance(other, torch.fx.Node)
        ins = [ctx.tensor(a), ctx.tensor(other) if tensor else -1]
        ctx.emit(name, ins, [ctx.output(node)], other=None if tensor else int(other))

    return lower


def _check_logical(node):
    out = node.meta["val"].dtype
    if out != torch.bool:
        return f"result dtype: expected torch.bool, got {out}"
    return four_byte_inputs(node)


def _lower_unary(name: str):
    def lower(ctx, node):
        ctx.emit(name, [ctx.tensor(node.args[0])], [ctx.output(node)])

    return lower


for _name, _doc in BITWISE.items():
    register_op(_name, tuple(f"aten.{_name}.{form}" for form in ("Tensor", "Scalar",
                                                                  "Scalar_Tensor")),
                infer_binary, _lower_binary(_name), dtypes=BITWISE_DTYPES, check=_check_bitwise,
                attrs={"other": "int?"}, arity=(2, 1),
                doc=f"{_doc} on bool or integers, broadcasting; scalar operand as attribute "
                    "`other`")
for _name, _doc in LOGICAL.items():
    register_op(_name, (f"aten.{_name}.default",), infer_binary, _lower_binary(_name),
                dtypes=FOUR_BYTE, check=_check_logical, attrs={"other": "int?"}, arity=(2, 1),
                doc=f"bool {_doc}, each operand read as x != 0, broadcasting")
register_op("bitwise_not", ("aten.bitwise_not.default",), infer_unary,
            _lower_unary("bitwise_not"), dtypes=BITWISE_DTYPES,
            check=_check_bitwise_not,
            doc="~x on integers, not x on bool", attrs={}, arity=(1, 1))
register_op("logical_not", ("aten.logical_not.default",), infer_unary,
            _lower_unary("logical_not"), dtypes=FOUR_BYTE, check=_check_logical,
            doc="bool x == 0", attrs={}, arity=(1, 1))

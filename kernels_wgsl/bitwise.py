"""Bitwise and logical kernels (bitwise.wgsl): bitwise_and / or / xor / not and logical_and /
or / xor / not, broadcasting.

and, or, xor and not move bits, so one pass serves bool and every integer; a logical op reads
each operand as x != 0 by its kind (f32, i32 or bool, kernels_wgsl.element_kind of the graph's
dtype), a pipeline constant. A scalar operand (an int; bitwise ops only) travels in the params
as its i32 bits and binds nothing.
"""
from __future__ import annotations

from kernels_wgsl import (KIND_PRELUDE, Dispatch, broadcast_layout, element_kind, groups, numel,
                          register_wgsl, words)

WG = 256
BINARY = ("bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or",
          "logical_xor")
UNARY = ("bitwise_not", "logical_not")
CODES = {name: code for code, name in enumerate(BINARY + UNARY)}
PRELUDE = "\n".join([KIND_PRELUDE] + [f"const OP_{name.upper()}: u32 = {code}u;"
                                      for name, code in CODES.items()])
I32 = element_kind("int32")


def _binary_builder(name: str):
    def build(ins, outs, attrs, info):
        has_b = ins[1] is not None

        def sizes(ins, outs, attrs):
            out = outs[0]
            bits = 0 if has_b else int(attrs["other"])
            return (words(numel(out), len(out), bits, 0,
                          *broadcast_layout(out, ins[0], ins[1] if has_b else None)),
                    groups(numel(out), WG))

        b_kind = element_kind(info.in_dtypes[1]) if has_b else I32
        constants = (("OP", CODES[name]),
                     ("A_KIND", element_kind(info.in_dtypes[0])), ("B_KIND", b_kind),
                     ("HAS_B", int(has_b)))
        return [Dispatch("bitwise", "bitwise_binary", (0, 1, 2), (2,), sizes, constants,
                         label=name, prelude=PRELUDE)]

    return build


def _unary_builder(name: str):
    def build(ins, outs, attrs, info):
        def sizes(ins, outs, attrs):
            return words(numel(outs[0])), groups(numel(outs[0]), WG)

        constants = (("OP", CODES[name]),
                     ("A_KIND", element_kind(info.in_dtypes[0])))
        return [Dispatch("bitwise", "bitwise_unary", (0, 1), (1,), sizes, constants,
                         label=name, prelude=PRELUDE)]

    return build


for _name in BINARY:
    register_wgsl(_name)(_binary_builder(_name))
for _name in UNARY:
    register_wgsl(_name)(_unary_builder(_name))

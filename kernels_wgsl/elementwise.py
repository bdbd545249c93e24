"""Elementwise kernels (elementwise.wgsl): binary ops with broadcasting, unary activations.

A binary op reads both operands through element strides (zero along broadcast dims), so one
pass covers every broadcast; a scalar operand travels in the params and binds nothing.
silu_mul (the SwiGLU product silu(gate) * up, delegate/ops/silu_mul.py) is a binary op of this
table: one pass, the sigmoid in registers. Each operand's kind (f32, or i32 holding int32,
int64 and bool; kernels_wgsl.element_kind) is a pipeline constant; the op computes in f32
when torch's promotion gives a float (a float operand, or div), else in i32.

The op codes come from one table here: `PRELUDE` declares them to the shader as
`const OP_<NAME>: u32`, its switch names them, and each dispatch picks one as the OP override.
"""
from __future__ import annotations

import math

from delegate.errors import UnsupportedError
from kernels_wgsl import (KIND_PRELUDE, Dispatch, broadcast_layout, element_kind, groups, numel,
                          padded, register_wgsl, words)

WG = 256
BINARY = ("add", "sub", "mul", "div", "silu_mul")
FLOAT_ONLY = ("div", "silu_mul")   # f32 whatever the operands: torch's int / int is a float
F32, I32 = element_kind("float32"), element_kind("int32")


def _bound(value, default: float) -> float:
    return default if value is None else float(value)


# unary op -> its scalars s0..s2 from the attributes (None: it has none)
UNARY = {
    "neg": None, "exp": None, "sigmoid": None, "relu": None, "tanh": None, "rsqrt": None,
    "silu": None, "gelu": None, "abs": None, "sqrt": None, "log": None, "log1p": None,
    "ceil": None, "floor": None, "hardswish": None, "hardsigmoid": None, "sin": None,
    "cos": None,
    "pow": lambda a: (float(a["exponent"]),),
    "clamp": lambda a: (_bound(a.get("min"), -math.inf), _bound(a.get("max"), math.inf)),
    "leaky_relu": lambda a: (float(a["negative_slope"]),),
    "elu": lambda a: (float(a["alpha"]), float(a["scale"]), float(a["input_scale"])),
}
VARIANTS = ("gelu_tanh",)   # codes with no op of their own: gelu(approximate="tanh")
CODES = {name: code for code, name in enumerate(BINARY + tuple(UNARY) + VARIANTS)}
PRELUDE = "\n".join([KIND_PRELUDE] + [f"const OP_{name.upper()}: u32 = {code}u;"
                                      for name, code in CODES.items()])


def _binary_builder(name: str):
    def build(ins, outs, attrs, info):
        has_b = ins[1] is not None
        kinds = [element_kind(d) for d in info.in_dtypes[:1 + has_b]]
        float_math = (name in FLOAT_ONLY or F32 in kinds
                      or isinstance(attrs.get("other"), float))
        number = float if float_math else int   # the type a scalar and alpha are packed in
        b_kind = kinds[1] if has_b else F32 if float_math else I32

        def sizes(ins, outs, attrs):
            out = outs[0]
            alpha = number(attrs["alpha"]) if attrs.get("alpha") is not None else number(1)
            other = number(attrs["other"]) if attrs.get("other") is not None else number(0)
            return (words(numel(out), len(out), alpha, other,
                          *broadcast_layout(out, ins[0], ins[1] if has_b else None)),
                    groups(numel(out), WG))

        constants = (("OP", CODES[name]), ("HAS_B", int(has_b)), ("A_KIND", kinds[0]),
                     ("B_KIND", b_kind), ("FLOAT_MATH", int(float_math)))
        return [Dispatch("elementwise", "binary", (0, 1, 2), (2,), sizes, constants, label=name,
                         prelude=PRELUDE)]

    return build


def _unary_builder(name: str):
    scalars = UNARY[name]

    def build(ins, outs, attrs, info):
        code = CODES[name]
        if name == "gelu" and attrs.get("approximate", "none") == "tanh":
            code = CODES["gelu_tanh"]

        def sizes(ins, outs, attrs):
            n = numel(outs[0])
            s = scalars(attrs) if scalars else ()
            return words(n, *padded(s, 3, 0.0)), groups(n, WG)

        if element_kind(info.in_dtypes[0]) == F32:
            return [Dispatch("elementwise", "unary", (0, 1), (1,), sizes, (("OP", code),),
                             label=name, prelude=PRELUDE)]
        if name != "neg":   # the one unary op the registry runs on integers
            raise UnsupportedError(f"{name} on WebGPU: expected a float32 input, "
                                   f"got {info.in_dtypes[0]}")
        return [Dispatch("elementwise", "neg_i32", (0, 1), (1,), sizes, label=name,
                         prelude=PRELUDE)]

    return build


for _name in BINARY:
    register_wgsl(_name)(_binary_builder(_name))
for _name in UNARY:
    register_wgsl(_name)(_unary_builder(_name))

"""Elementwise kernels (elementwise.wgsl): binary ops with broadcasting, unary activations.

A binary op reads both operands through element strides (zero along broadcast dims), so one
pass covers every broadcast; a scalar operand travels in the params and binds nothing.
"""
from __future__ import annotations

from kernels_wgsl import (Dispatch, broadcast_strides, groups, numel,
                          padded, register_wgsl, words)

WG = 256
BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3}
UNARY = {"neg": 0, "exp": 1, "sigmoid": 2, "relu": 3, "tanh": 4, "rsqrt": 5, "silu": 6,
         "gelu": 7, "pow": 9}
GELU_TANH = 8


def _binary_builder(name: str):
    def build(ins, outs, attrs, info):
        has_b = ins[1] is not None

        def sizes(ins, outs, attrs):
            out = outs[0]
            b_strides = broadcast_strides(ins[1], out) if has_b else [0] * len(out)
            alpha = float(attrs["alpha"]) if attrs.get("alpha") is not None else 1.0
            other = float(attrs["other"]) if attrs.get("other") is not None else 0.0
            return (words(numel(out), len(out), alpha, other, padded(out),
                          padded(broadcast_strides(ins[0], out)), padded(b_strides)),
                    groups(numel(out), WG))

        return [Dispatch("elementwise", "binary", (0, 1, 2), (2,), sizes,
                         (("OP", BINARY[name]), ("HAS_B", int(has_b))), label=name)]

    return build


def _unary_builder(name: str):
    def build(ins, outs, attrs, info):
        code = UNARY[name]
        if name == "gelu" and attrs.get("approximate", "none") == "tanh":
            code = GELU_TANH

        def sizes(ins, outs, attrs):
            n = numel(outs[0])
            return words(n, float(attrs.get("exponent") or 0.0)), groups(n, WG)

        return [Dispatch("elementwise", "unary", (0, 1), (1,), sizes, (("OP", code),), label=name)]

    return build


for _name in BINARY:
    register_wgsl(_name)(_binary_builder(_name))
for _name in UNARY:
    register_wgsl(_name)(_unary_builder(_name))

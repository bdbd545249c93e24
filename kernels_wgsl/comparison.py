"""Comparison kernels (comparison.wgsl): eq, ne, lt, le, gt, ge and where, broadcasting.

Each operand's kind (f32, i32 or bool, kernels_wgsl.element_kind of the graph's dtype) is a
pipeline constant, so one pass compares any mix of them as torch promotes: as f32 when either
side is float, else as i32. A scalar operand travels in the params as its own bits (an int as
i32, a float as f32) and binds nothing.
"""
from __future__ import annotations

from kernels_wgsl import (KIND_PRELUDE, Dispatch, broadcast_layout, element_kind, groups, numel,
                          register_wgsl, words)

WG = 256
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
PRELUDE = "\n".join([KIND_PRELUDE] + [f"const OP_{name.upper()}: u32 = {code}u;"
                                      for code, name in enumerate(COMPARISONS)])


def _comparison_builder(name: str):
    def build(ins, outs, attrs, info):
        has_b = ins[1] is not None
        other = attrs.get("other")
        b_kind = element_kind(info.in_dtypes[1] if has_b else
                              "float32" if isinstance(other, float) else "int32")

        def sizes(ins, outs, attrs):
            out = outs[0]
            bits = 0 if has_b else attrs["other"]
            return (words(numel(out), len(out), bits, 0,
                          *broadcast_layout(out, ins[0], ins[1] if has_b else None)),
                    groups(numel(out), WG))

        constants = (("OP", COMPARISONS.index(name)), ("A_KIND", element_kind(info.in_dtypes[0])),
                     ("B_KIND", b_kind), ("HAS_B", int(has_b)))
        return [Dispatch("comparison", "compare", (0, 1, 2), (2,), sizes, constants, label=name,
                         prelude=PRELUDE)]

    return build


for _name in COMPARISONS:
    register_wgsl(_name)(_comparison_builder(_name))


@register_wgsl("where")
def where(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        out = outs[0]
        return words(numel(out), len(out), 0, 0, *broadcast_layout(out, *ins[:3])), \
            groups(numel(out), WG)

    return [Dispatch("comparison", "where_select", (0, 1, 2, 3), (3,), sizes, label="where",
                     prelude=PRELUDE)]

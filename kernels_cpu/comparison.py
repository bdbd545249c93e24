"""Comparison CPU kernels: torch's out= comparisons (bool results) and where, on disjoint
chunks of the output (kernels_cpu/elementwise.py's map_chunks). torch promotes mixed operands
and compares NaN unequal, which is the op's definition (delegate/ops/comparison.py)."""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel
from kernels_cpu.elementwise import map_chunks


def _comparison(torch_fn):
    def kernel(ins, outs, attrs, scratch):
        b = ins[1] if len(ins) > 1 and ins[1] is not None else attrs["other"]
        map_chunks(lambda o, x, y: torch_fn(x, y, out=o), outs[0], ins[0], b)

    return kernel


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    register_kernel(_name)(_comparison(getattr(torch, _name)))


@register_kernel("where")
def where(ins, outs, attrs, scratch):
    map_chunks(lambda o, c, a, b: torch.where(c, a, b, out=o), outs[0], *ins[:3])

"""Bitwise and logical CPU kernels: torch's out= ops on disjoint chunks of the output
(kernels_cpu/elementwise.py's map_chunks). torch promotes bool and integer operands and reads
a logical op's operands as x != 0, which is the ops' definition (delegate/ops/bitwise.py)."""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel
from kernels_cpu.elementwise import map_chunks


def _binary(torch_fn):
    def kernel(ins, outs, attrs, scratch):
        b = ins[1] if len(ins) > 1 and ins[1] is not None else attrs["other"]
        if not isinstance(b, torch.Tensor) and outs[0].dtype == torch.bool:
            b = bool(b)   # the blob holds a bool scalar as 0 / 1; torch wants it a bool here
        map_chunks(lambda o, x, y: torch_fn(x, y, out=o), outs[0], ins[0], b)

    return kernel


def _unary(torch_fn):
    def kernel(ins, outs, attrs, scratch):
        map_chunks(lambda o, x: torch_fn(x, out=o), outs[0], ins[0])

    return kernel


for _name in ("bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or",
              "logical_xor"):
    register_kernel(_name)(_binary(getattr(torch, _name)))
for _name in ("bitwise_not", "logical_not"):
    register_kernel(_name)(_unary(getattr(torch, _name)))

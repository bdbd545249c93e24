"""ExecuTorch's primitive operators, in Python: symbolic scalar math and the emitter's helpers.

ExecuTorch's C++ runtime registers these itself (kernels/prim_ops); they have no `.out` ATen
overload. Convention (as in the C++ kernels): every argument but the last is an input, and the
scalar result is written into the last argument's value. The two tensor helpers differ and say
so below.
"""
from __future__ import annotations

import math
import operator

import torch

from delegate.runtime.values import resize_within


def _local_scalar_dense(t: torch.Tensor):
    return t.item()


def _sym_size(t: torch.Tensor, dim: int) -> int:
    return int(t.size(dim))


def _sym_stride(t: torch.Tensor, dim: int) -> int:
    return int(t.stride(dim))


# "namespace::name.overload" -> function of the input values, returning the result value.
SCALAR_OPS = {
    "executorch_prim::add.Scalar": operator.add,
    "executorch_prim::sub.Scalar": operator.sub,
    "executorch_prim::mul.Scalar": operator.mul,
    "executorch_prim::floordiv.Scalar": operator.floordiv,
    "executorch_prim::floordiv.int": operator.floordiv,
    "executorch_prim::truediv.Scalar": operator.truediv,
    "executorch_prim::mod.Scalar": lambda a, b: int(a) % int(b),
    "executorch_prim::mod.int": lambda a, b: int(a) % int(b),
    "executorch_prim::eq.Scalar": operator.eq,
    "executorch_prim::gt.Scalar": operator.gt,
    "executorch_prim::lt.Scalar": operator.lt,
    "executorch_prim::ge.Scalar": operator.ge,
    "executorch_prim::le.Scalar": operator.le,
    "executorch_prim::neg.Scalar": operator.neg,
    "executorch_prim::sym_not.Scalar": operator.not_,
    "executorch_prim::sym_float.Scalar": float,
    "executorch_prim::sym_int.Scalar": int,
    "executorch_prim::sym_max.Scalar": max,
    "executorch_prim::sym_min.Scalar": min,
    "executorch_prim::sym_ite.Scalar": lambda b, t, f: t if b else f,
    "executorch_prim::ceil.Scalar": math.ceil,
    "executorch_prim::round.Scalar": round,
    "executorch_prim::trunc.Scalar": math.trunc,
    "aten::sym_size.int": _sym_size,
    "aten::sym_stride.int": _sym_stride,
    "aten::sym_numel": lambda t: int(t.numel()),
    "aten::sym_numel.default": lambda t: int(t.numel()),
    "aten::_local_scalar_dense": _local_scalar_dense,
    "aten::_local_scalar_dense.default": _local_scalar_dense,
}


def et_copy_index(copy_to: torch.Tensor, copy_from: torch.Tensor, index: int) -> None:
    """copy_to[index] = copy_from, growing dim 0 to index + 1 (how the emitter stacks a map)."""
    shape = [int(index) + 1, *copy_from.shape]
    if list(copy_to.shape) != shape:
        resize_within(copy_to, shape, "et_copy_index")
    copy_to[int(index)].copy_(copy_from)


def et_view(self: torch.Tensor, size: list[int]) -> torch.Tensor:
    """The emitter's view that could not be elided: the out value becomes a view of self."""
    return self.view([int(s) for s in size])


def prim_op(qualified: str):
    """(function, writes_last_arg) for a primitive op name, or None when it is not one."""
    if qualified in SCALAR_OPS:
        return SCALAR_OPS[qualified], True
    if qualified == "executorch_prim::et_view.default":
        return et_view, True
    if qualified == "executorch_prim::et_copy_index.tensor":
        return et_copy_index, False
    return None

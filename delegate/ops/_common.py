"""Helpers every op family shares: argument access, the shape rules torch follows (dim
wrapping, broadcasting, numel), and the support checks on a node's tensor arguments."""
from __future__ import annotations

import contextvars
import operator
from contextlib import contextmanager

import torch

from delegate.errors import DelegateError, expect
from delegate.shape_math import norm_dim, numel  # noqa: F401  (the op families use them)


# The dtypes the executors hold as 4-byte elements (webgpu: int64 as i32, bool as u32 0/1):
# copies, masks, comparisons and casts move any of them.
FOUR_BYTE = (torch.float32, torch.int32, torch.int64, torch.bool)

_CLAIMING_FOR: contextvars.ContextVar = contextvars.ContextVar("etwgpu_claiming_for", default=None)


@contextmanager
def claiming_for(device: str):
    """While the partitioner asks a check about a node: the device it claims nodes for."""
    token = _CLAIMING_FOR.set(device)
    try:
        yield
    finally:
        _CLAIMING_FOR.reset(token)


def claiming_device() -> "str | None":
    """"webgpu" or "cpu" inside the partitioner's support check, None elsewhere. A check uses
    it only for a limit of one device's kernel (the WGSL SDPA's head dims)."""
    return _CLAIMING_FOR.get()


def arg(node, index: int, name: str, default=None):
    """A call argument given positionally or by keyword (edge uses both)."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def broadcast(*shapes) -> tuple:
    """Numpy/torch broadcasting of shapes (None entries are skipped)."""
    shapes = [tuple(s) for s in shapes if s is not None]
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        sizes = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        big = sizes - {1}
        expect(len(big) <= 1, DelegateError, "broadcast", f"sizes equal or 1 in {shapes}",
               sorted(sizes))
        out.append(big.pop() if big else 1)
    return tuple(out)


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def infer_binary(in_shapes, attrs):
    """A binary op's output shape: its operands broadcast; b absent means the scalar `other`."""
    one_input(in_shapes)
    b = in_shapes[1] if len(in_shapes) > 1 else None
    expect(b is not None or attrs.get("other") is not None, DelegateError, "binary operand",
           "a tensor or a scalar `other`", "neither")
    return [broadcast(in_shapes[0], b)]


def one_input(in_shapes, count: int = 1) -> None:
    expect(len(in_shapes) >= count and all(s is not None for s in in_shapes[:count]),
           DelegateError, "inputs", f"{count} tensor shapes", in_shapes)


def tensor_args(node) -> list:
    args = list(node.args) + list(node.kwargs.values())
    flat = [a for x in args for a in (x if isinstance(x, (list, tuple)) else [x])]
    return [a for a in flat if isinstance(a, torch.fx.Node)
            and isinstance(a.meta.get("val"), torch.Tensor)]


def float_dtypes(node) -> "str | None":
    """Reason unless every tensor argument is float32 (mixed dtypes promote in torch).

    Ops kept from decomposition check only this: the partitioner also asks them on the ATen
    graph, where the views feeding them (q.transpose(1, 2)) are still strided."""
    for a in tensor_args(node):
        val = a.meta["val"]
        if val.dtype != torch.float32:
            return f"input {a.name}: expected float32, got {val.dtype}"
    return None


def float_inputs(node) -> "str | None":
    """float_dtypes, and contiguous dim order (kernels index row-major buffers)."""
    return float_dtypes(node) or contiguous_inputs(node)


def four_byte_inputs(node) -> "str | None":
    """Reason unless every tensor argument and result is of a FOUR_BYTE dtype, in contiguous
    dim order."""
    vals = [a.meta["val"] for a in tensor_args(node)]
    outs = node.meta.get("val")
    vals += [v for v in (outs if isinstance(outs, (list, tuple)) else [outs])
             if isinstance(v, torch.Tensor)]
    bad = [v.dtype for v in vals if v.dtype not in FOUR_BYTE]
    return f"dtypes {bad}: expected {FOUR_BYTE}" if bad else contiguous_inputs(node)


def contiguous_inputs(node) -> "str | None":
    """Reason unless every tensor argument is in contiguous (row-major) dim order."""
    for a in tensor_args(node):
        val = a.meta["val"]
        order = tuple(val.dim_order())
        if order != tuple(range(val.dim())):
            return f"input {a.name}: expected contiguous dim order, got {list(order)}"
    return None


def only_output0(node):
    """The getitem reading output 0 of a tuple-valued node (batch_norm's y, max_pool2d's
    maxima) when it is the node's only reader; None when another output is read or it is not."""
    users = list(node.users)
    if len(users) != 1 or users[0].target is not operator.getitem or users[0].args[1] != 0:
        return None
    return users[0]

"""Helpers every op family shares: argument access, the shape rules torch follows (dim
wrapping, broadcasting, numel), and the support checks on a node's tensor arguments."""
from __future__ import annotations

import contextvars
from contextlib import contextmanager

import torch

from delegate.errors import DelegateError, expect
from delegate.shape_math import norm_dim, numel  # noqa: F401  (the op families use them)


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


def contiguous_inputs(node) -> "str | None":
    """Reason unless every tensor argument is in contiguous (row-major) dim order."""
    for a in tensor_args(node):
        val = a.meta["val"]
        order = tuple(val.dim_order())
        if order != tuple(range(val.dim())):
            return f"input {a.name}: expected contiguous dim order, got {list(order)}"
    return None

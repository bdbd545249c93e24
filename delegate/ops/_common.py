"""Helpers every op family shares: argument access, the shape rules torch follows (dim
wrapping, broadcasting, numel), and the support checks on a node's tensor arguments."""
from __future__ import annotations

import torch

from delegate.errors import DelegateError, expect


def arg(node, index: int, name: str, default=None):
    """A call argument given positionally or by keyword (edge uses both)."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def norm_dim(d: int, ndim: int, what: str = "dim", scalar_ok: bool = False) -> int:
    """Torch's dim wrapping; with scalar_ok a 0-d tensor accepts dims 0 and -1 (softmax,
    squeeze), otherwise indexing a dim needs rank >= 1."""
    expect(ndim >= 1 or scalar_ok, DelegateError, what, "a tensor of rank >= 1", "rank 0")
    n = max(ndim, 1)
    expect(-n <= d < n, DelegateError, what, f"a dim in [{-n}, {n})", d)
    return d % n


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


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

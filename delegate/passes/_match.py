"""The node tests every graph pass matches with (a module of helpers, not a pass)."""
from __future__ import annotations

import operator
from typing import Optional

import torch

from delegate.ops.export import target_name

MUL = "aten.mul.Tensor"


def is_call(node, *targets: str) -> bool:
    """node is an fx call of one of these edge targets ("aten.mul.Tensor")."""
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and target_name(node.target) in targets)


def only_feeds(node, user) -> bool:
    """node's one consumer is user (a partition output is a consumer too)."""
    return list(node.users) == [user]


def unread_before(node, later, place: dict, where=None) -> bool:
    """Nothing reads node's value (through getitem where it is a tuple, as a functionalized
    custom op's) before `later` in graph order (place: node -> index). A pass that emits two
    matches at the later one needs it of the earlier. where(value, reader): the node where
    that reader's read of the value happens, when not at the reader itself (else None)."""
    reads = []   # (the value read, its reader)
    for u in node.users:
        reads += [(u, r) for r in u.users] if u.target is operator.getitem else [(node, u)]
    return all(place[(where and where(v, r)) or r] > place[later] for v, r in reads)


def product(node) -> Optional[tuple]:
    """(x, y) of a mul of two tensors, else None."""
    if not is_call(node, MUL) or len(node.args) != 2 or node.kwargs:
        return None
    x, y = node.args
    return (x, y) if isinstance(x, torch.fx.Node) and isinstance(y, torch.fx.Node) else None


def lower_nothing(ctx, node) -> None:
    """A node a pass absorbed into the node that lowers the whole match."""

"""Fuse a SwiGLU product into one silu_mul (delegate/ops/silu_mul.py).

    silu(g) * up            aten.silu, aten.mul                (silu kept whole by the registry)
    sigmoid(g) * g * up     aten.sigmoid, aten.mul, aten.mul   (silu as edge decomposes it)
        ─► silu_mul(g, up) = g * sigmoid(g) * up, the sigmoid in registers

Either operand order of each mul matches (a re-associated sigmoid(g) * (g * up) does not).
It fires only where g, up and the product are float32 of one shape in contiguous dim order
(no broadcasting), and where each absorbed intermediate (the silu, or the sigmoid and its
product with g) has the final mul as its only consumer, so none is read elsewhere or leaves
the partition. The final mul then emits silu_mul and writes its own output; the absorbed
nodes emit nothing. The rewritten IR is what the memory planner sees, so g and up stay live
up to the fused node.
"""
from __future__ import annotations

from typing import Optional

import torch

from delegate.passes._match import (is_call as _is, lower_nothing as _lower_nothing,
                                    only_feeds as _only_feeds, product as _product)
from delegate.lowering import sym_text
from delegate.ops.export import target_name

SILU = "aten.silu.default"
SIGMOID = "aten.sigmoid.default"
MUL = "aten.mul.Tensor"


def detect(graph) -> dict:
    # Matches never overlap: each absorbed node feeds only its own final mul.
    rewrites = {}
    for node in graph.nodes:
        match = _match(node)
        if match is not None:
            gate, up, absorbed = match
            rewrites[node] = _lower_silu_mul(gate, up)
            rewrites.update((n, _lower_nothing) for n in absorbed)
    return rewrites


def _silu_of(node, user) -> Optional[tuple]:
    """(g, absorbed nodes) when node is silu(g), as one op or as sigmoid(g) * g, read only by
    user; else None."""
    if not _only_feeds(node, user):
        return None
    if _is(node, SILU) and len(node.args) == 1 and not node.kwargs:
        return node.args[0], (node,)
    pair = _product(node)
    if pair is None:
        return None
    for sig, g in (pair, pair[::-1]):
        if _is(sig, SIGMOID) and sig.args[0] is g and _only_feeds(sig, node):
            return g, (sig, node)
    return None


def _match(node) -> Optional[tuple]:
    """(gate, up, absorbed nodes) when node is silu(gate) * up in a form we fuse, else None."""
    pair = _product(node)
    if pair is None:
        return None
    for silu, up in (pair, pair[::-1]):
        found = _silu_of(silu, node)
        if found is not None and up not in found[1] and _same_float32(found[0], up, node):
            return found[0], up, found[1]
    return None


def _same_float32(*nodes) -> bool:
    """All float32 tensors of one shape (sizes compared as text: no guard on a symbol), in
    contiguous dim order."""
    vals = [n.meta.get("val") for n in nodes]
    if not all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in vals):
        return False
    if any(tuple(v.dim_order()) != tuple(range(v.dim())) for v in vals):
        return False
    shapes = {tuple(sym_text(s) for s in v.shape) for v in vals}
    return len(shapes) == 1


def _lower_silu_mul(gate, up):
    def lower(ctx, node):
        ctx.emit("silu_mul", [ctx.tensor(gate), ctx.tensor(up)], [ctx.output(node)])

    return lower

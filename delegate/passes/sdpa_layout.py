"""Read q, and write the output, of an sdpa through the permutes around it (delegate/ops/
attention.py's q_dims and out_dims).

ExecuTorch's Llama attention (examples/models/llama/attention.py), as edge holds it:

    q = permute(q_rotated, [0, 2, 1, 3])           [B, T, H, D] -> [B, H, T, D]
    y = permute(sdpa(q, k, v, ...), [0, 2, 1, 3])  [B, H, T, D] -> [B, T, H, D], then view, wo
        ─► y = sdpa(q_rotated, k, v, ..., q_dims=[0, 2, 1, 3], out_dims=[0, 2, 1, 3])

Each half fires on its own: q's where the sdpa alone reads the permute, and only as q; the
output's where the permute is the sdpa's only consumer (so the sdpa's own layout is never
read and never leaves the partition). Either permute must keep the head dim last, so the
kernels' rows stay contiguous, and its operand and result be 4-D float32 in contiguous dim
order. The q permute emits nothing; with the output's, the sdpa emits nothing and the
permute emits the sdpa, writing its own value. The kernels compute the same sums in the same
order as over copies, so the outputs are the unfused ones bit for bit (tested).
"""
from __future__ import annotations

from typing import Optional

import torch

from delegate.ops.attention import lower_sdpa
from delegate.passes._match import (is_call as _is, lower_nothing as _lower_nothing,
                                    only_feeds as _only_feeds)

SDPA = "aten.scaled_dot_product_attention.default"
PERMUTE = "aten.permute_copy.default"


def detect(graph) -> dict:
    # Matches never overlap: each absorbed permute is read by, or reads, its one sdpa.
    rewrites = {}
    for node in graph.nodes:
        if not _is(node, SDPA):
            continue
        q, out = node.args[0], next(iter(node.users), None)
        q_dims = _dims(q) if _read_as_q_alone(q, node) else None
        out_dims = _dims(out) if _only_feeds(node, out) else None
        if q_dims is not None:
            rewrites[q] = _lower_nothing
        if out_dims is not None:   # the sdpa runs where its output's permute stood
            rewrites[node] = _lower_nothing
            rewrites[out] = _lower_sdpa(node, q_dims, out_dims)
        elif q_dims is not None:
            rewrites[node] = _lower_sdpa(node, q_dims, None)
    return rewrites


def _read_as_q_alone(q, sdpa) -> bool:
    """sdpa is q's one consumer and reads it only as q (as k or v too, it needs the copy)."""
    return _only_feeds(q, sdpa) and [*sdpa.args, *sdpa.kwargs.values()].count(q) == 1


def _dims(permute) -> Optional[list]:
    """The dims of a 4-D float32 permute that keeps the last dim, else None."""
    if not _is(permute, PERMUTE) or len(permute.args) != 2 or permute.kwargs:
        return None
    dims = [int(d) % 4 for d in permute.args[1]]
    if len(dims) != 4 or dims[-1] != 3 or not _plain(permute.args[0], permute):
        return None
    return dims


def _plain(*nodes) -> bool:
    """Every node holds a 4-D float32 tensor in contiguous dim order."""
    vals = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in nodes]
    return all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.dim() == 4
               and tuple(v.dim_order()) == (0, 1, 2, 3) for v in vals)


def _lower_sdpa(sdpa, q_dims, out_dims):
    q = sdpa.args[0].args[0] if q_dims is not None else None

    def lower(ctx, node):
        lower_sdpa(ctx, sdpa, q=q, q_dims=q_dims or (), out=node, out_dims=out_dims or ())

    return lower

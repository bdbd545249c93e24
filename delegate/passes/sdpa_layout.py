"""Read q, k and v, and write the output, of an sdpa through the permutes around it
(delegate/ops/attention.py's q_dims, k_dims, v_dims and out_dims).

ExecuTorch's Llama attention (examples/models/llama/attention.py), as edge holds it:

    q = permute(q_rotated, [0, 2, 1, 3])           [B, T, H, D] -> [B, H, T, D]
    k = permute(k_rotated, [0, 2, 1, 3])           (v alike; without a KV cache these reach
                                                    the sdpa, through repeat_interleave)
    y = permute(sdpa(q, k, v, ...), [0, 2, 1, 3])  [B, H, T, D] -> [B, T, H, D], then view, wo
        ─► y = sdpa(q_rotated, k_rotated, v_rotated, ..., q_dims=k_dims=v_dims=[0, 2, 1, 3],
                    out_dims=[0, 2, 1, 3])

Each fires on its own: an operand's where its permute's value reaches the sdpa alone, and only
as that operand (directly, or through the repeat of its heads that the sdpa's GQA reads
without a copy: attention.sdpa_operands); the output's where the permute is the sdpa's only
consumer (so the sdpa's own layout is never read and never leaves the partition). Every
permute must keep the head dim last, so the kernels' rows stay contiguous, and its operand and
result be 4-D float32 in contiguous dim order. An operand's permute (and its repeat chain)
emits nothing; with the output's, the sdpa emits nothing and the permute emits the sdpa,
writing its own value. The kernels compute the same sums in the same order as over copies, so
the outputs are the unfused ones bit for bit (tested).
"""
from __future__ import annotations

from typing import Optional

import torch

from delegate.ops.attention import SDPA, lower_sdpa, sdpa_operands
from delegate.passes._match import (is_call as _is, lower_nothing as _lower_nothing,
                                    only_feeds as _only_feeds)

PERMUTE = "aten.permute_copy.default"


def detect(graph) -> dict:
    # Matches never overlap: each absorbed permute is read by, or reads, its one sdpa.
    rewrites = {}
    for node in graph.nodes:
        if not _is(node, SDPA):
            continue
        through = {}   # operand index -> (the permute's input, its dims)
        for i, x in enumerate(sdpa_operands(node)[:3]):
            path, dims = _sole_path(x, node, i), _dims(x)
            if path is not None and dims is not None:
                through[i] = (x.args[0], dims)
                rewrites.update((n, _lower_nothing) for n in path)
        out = next(iter(node.users), None)
        out_dims = _dims(out) if _only_feeds(node, out) else None
        if out_dims is not None:   # the sdpa runs where its output's permute stood
            rewrites[node] = _lower_nothing
            rewrites[out] = _lower_sdpa(node, through, out_dims)
        elif through:
            rewrites[node] = _lower_sdpa(node, through, None)
    return rewrites


def _sole_path(x, sdpa, i) -> Optional[list]:
    """The nodes from x to sdpa's argument i (x alone where it is that argument, else the
    repeat chain sdpa_operands read it through), when each is read by the next alone and
    the sdpa reads argument i only as that operand (as two operands, it needs the copy)."""
    operand, path = sdpa.args[i], [x]
    while path[-1] is not operand:   # graph order is acyclic: ends at the argument or a fork
        if len(path[-1].users) != 1:
            return None
        path.append(next(iter(path[-1].users)))
    reads = [*sdpa.args, *sdpa.kwargs.values()].count(operand)
    return path if _only_feeds(operand, sdpa) and reads == 1 else None


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


def _lower_sdpa(sdpa, through, out_dims):
    def lower(ctx, node):
        lower_sdpa(ctx, sdpa, through=through, out=node, out_dims=out_dims or ())

    return lower

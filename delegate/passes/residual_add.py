"""Fuse a residual add into the q4gsw linear before it (delegate/ops/q4gsw.py).

    y   = linear(x, dequant(W), b)     aten.linear of the linear_q4gsw pattern, bias or not
    out = y + r  |  r + y              aten.add.Tensor, alpha 1, either operand order
        ─► out = linear_q4gsw(x, packed, scales, b, r): the kernels' epilogue adds r

A decoder layer's two residuals, `h = x + wo(attn)` and `out = h + w2(ffn)`, each stop being
a dispatch (WebGPU) or a pass over memory (CPU) of their own. It fires only where y, r and
the sum are float32 of one shape in contiguous dim order (no broadcasting), r is not y itself,
and the add is y's only consumer, so y is never read elsewhere or leaves the partition. A
linear that delegate/passes/fuse_linear.py groups with others (whose outputs the multi-output
op scatters, with no binding left for residuals) is left alone, whether that pass runs or not,
so each pass can be toggled without changing what the other rewrites. The add emits the
linear_q4gsw and writes its own output; the linear emits nothing. The fused node stands where
the add stood, so x stays live up to it in the IR the memory planner sees, and r is one of
its inputs, so the planner never gives out r's bytes.

Numerics: the epilogue computes (acc + b) + r in float32, the unfused linear's rounding and
then the unfused add's (a + b is commutative in IEEE arithmetic, alpha 1 multiplies exactly),
so the fused output is the unfused one bit for bit, on both executors (tested).
"""
from __future__ import annotations

from typing import Optional

import torch

from delegate.ops.export import pattern_for
from delegate.ops.q4gsw import lower_linear_residual
from delegate.passes._match import (is_call as _is, lower_nothing as _lower_nothing,
                                    only_feeds as _only_feeds)
from delegate.passes.fuse_linear import _groups as _fused_groups
from delegate.passes.swiglu import _same_float32

ADD = "aten.add.Tensor"
LINEAR = "aten.linear.default"


def detect(graph) -> dict:
    # Matches never overlap: each absorbed linear feeds only its own add.
    grouped = {linear for x in graph.nodes for group in _fused_groups(x) for linear in group}
    rewrites = {}
    for node in graph.nodes:
        match = _match(node, grouped)
        if match is not None:
            linear, residual = match
            rewrites[node] = _lower_linear_residual(linear, residual)
            rewrites[linear] = _lower_nothing
    return rewrites


def _sum_operands(node) -> Optional[tuple]:
    """(a, b) of an add of two tensors with alpha 1, else None."""
    if not _is(node, ADD) or len(node.args) != 2 or set(node.kwargs) - {"alpha"}:
        return None
    alpha = node.kwargs.get("alpha", 1)
    if isinstance(alpha, bool) or alpha != 1:
        return None
    a, b = node.args
    return (a, b) if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) else None


def _match(node, grouped) -> Optional[tuple]:
    """(linear, residual) when node is linear_q4gsw(...) + residual in a form we fuse."""
    pair = _sum_operands(node)
    if pair is None:
        return None
    for linear, residual in (pair, pair[::-1]):
        pattern = pattern_for(linear) if _is(linear, LINEAR) else None
        if (pattern is not None and pattern.name == "linear_q4gsw" and residual is not linear
                and linear not in grouped and _only_feeds(linear, node)
                and _same_float32(linear, residual, node)):
            return linear, residual
    return None


def _lower_linear_residual(linear, residual):
    def lower(ctx, node):
        lower_linear_residual(ctx, linear, residual, node)

    return lower

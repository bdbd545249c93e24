"""Fuse the q4gsw linears that read one input into one multi-output linear_q4gsw_multi.

    q = x @ Wq^T,  k = x @ Wk^T,  v = x @ Wv^T   ->   (q, k, v) = x @ [Wq; Wk; Wv]^T

Matches aten.linear nodes of the linear_q4gsw pattern (torchao int4 per-group weights,
delegate/ops/q4gsw.py) that take the same x, have no bias, and share K and the group size: the
q/k/v projections of an attention (3), the gate/up pair of an MLP (2). Any widths: the kernels
tile any N. Such a set is fused in graph order, 3 at a time (the kernels' most outputs; a
remainder of 2 is a pair, of 1 stays alone). The first linear of a group lowers to the fused
op, writing every member's output; the others emit nothing. Each output keeps its own value
(bit for bit: the kernels compute each column as its own linear would) and shape, so the
consumers are unchanged. On WebGPU the group runs one GEMM at M > 1 and one GEMV at M == 1
instead of one per linear.
"""
from __future__ import annotations

from delegate.passes._match import lower_nothing as _lower_nothing
from delegate.ops.export import pattern_for
from delegate.ops.q4gsw import linear_bias, lower_linear_multi, q4gsw_weight

MAX_OUTPUTS = 3


def detect(graph) -> dict:
    rewrites = {}
    for x in graph.nodes:
        for group in _groups(x):
            rewrites[group[0]] = _lower_group(group)
            rewrites.update((linear, _lower_nothing) for linear in group[1:])
    return rewrites


def _groups(x) -> list:
    """Lists of 2 or 3 fusable linears of input x, each in graph order."""
    by_shape: dict = {}
    for user in x.users:   # insertion order: graph order
        if user.op == "call_function" and user.args[0] is x and _fusable(user):
            qdata, _, gs = q4gsw_weight(user)
            by_shape.setdefault((int(qdata.shape[1]), gs), []).append(user)
    out = []
    for same in by_shape.values():
        out += [c for i in range(0, len(same), MAX_OUTPUTS)
                if len(c := same[i:i + MAX_OUTPUTS]) >= 2]
    return out


def _fusable(node) -> bool:
    pattern = pattern_for(node)
    return (pattern is not None and pattern.name == "linear_q4gsw"
            and linear_bias(node) is None)


def _lower_group(group):
    def lower(ctx, node):
        lower_linear_multi(ctx, group)

    return lower

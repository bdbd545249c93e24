"""Fuse an MLP's gate/up linears and their SwiGLU product into one linear_q4gsw_swiglu
(delegate/ops/q4gsw.py).

    g = linear(x, Wg),  u = linear(x, Wu)          the pair delegate/passes/fuse_linear.py groups
    out = silu(g) * u   (or sigmoid(g) * g * u)    what delegate/passes/swiglu.py matches
        ─► out = linear_q4gsw_swiglu(x, [Wg; Wu] rows interleaved): the kernels' epilogue
           takes column pair (g_j, u_j) from one thread and writes only out

A decoder layer's FFN loses the silu_mul dispatch (WebGPU) and g and u are never written to
memory. It fires only where fuse_linear's groups of x hold exactly this pair (a triple stays
as it is), swiglu's match holds, g is read only by the nodes that match absorbs and u only by
the final mul, so neither is read elsewhere or leaves the partition. It computes both matches
itself, so it fires whether those passes run or not, and it runs after them (PASSES order):
its rewrites replace theirs on the nodes it absorbs. The final mul emits the fused op; the
linears and the silu nodes emit nothing. x stays live up to the mul in the IR the memory
planner sees.

Numerics: each column is the value its own linear_q4gsw gives (the kernels compute a column
independently of where it sits), and the epilogue is silu_mul's arithmetic in silu_mul's
order, so the fused output is the unfused one bit for bit, on both executors (tested).
"""
from __future__ import annotations

from typing import Optional

from delegate.ops.q4gsw import lower_linear_swiglu
from delegate.passes._match import lower_nothing as _lower_nothing
from delegate.passes.fuse_linear import _groups as _fused_groups
from delegate.passes.swiglu import _match as _swiglu_match


def detect(graph) -> dict:
    # Matches never overlap: each absorbed node feeds only its own final mul.
    pairs = {frozenset(group) for x in graph.nodes for group in _fused_groups(x)
             if len(group) == 2}
    rewrites = {}
    for node in graph.nodes:
        match = _match(node, pairs)
        if match is not None:
            gate, up, absorbed = match
            rewrites[node] = _lower_linear_swiglu(gate, up)
            rewrites.update((n, _lower_nothing) for n in (gate, up, *absorbed))
    return rewrites


def _match(node, pairs) -> Optional[tuple]:
    """(gate linear, up linear, absorbed silu nodes) when node is silu(gate) * up over a
    fuse_linear pair whose outputs nothing else reads, else None."""
    found = _swiglu_match(node)
    if found is None:
        return None
    gate, up, absorbed = found
    if frozenset((gate, up)) not in pairs or gate is up:
        return None
    if not set(gate.users) <= set(absorbed) or list(up.users) != [node]:
        return None
    return gate, up, absorbed


def _lower_linear_swiglu(gate, up):
    def lower(ctx, node):
        lower_linear_swiglu(ctx, gate, up, node)

    return lower

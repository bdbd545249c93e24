"""Fuse an RMSNorm into the fused q4gsw linears that read it (delegate/ops/q4gsw.py).

    y = rms_norm(x, w, eps)                      aten.rms_norm over the last dim (nn.RMSNorm),
                                                 or the chain delegate/passes/rms_norm.py matches
    q, k, v = linear(y, Wq), linear(y, Wk), ..   a group delegate/passes/fuse_linear.py makes
        ─► q, k, v = linear_q4gsw_multi(x, [Wq; Wk; Wv], w, norm_eps=eps)
    out = silu(linear(y, Wg)) * linear(y, Wu)    what delegate/passes/linear_swiglu.py matches
        ─► out = linear_q4gsw_swiglu(x, [Wg; Wu] interleaved, w, norm_eps=eps)

A decoder layer's two norms stop being ops of their own: at M == 1 the WebGPU GEMV computes
the row's statistics in its prologue and normalizes x as it loads it, so a decode step loses
two dispatches per layer (on an H100 each costs 4-5 us of a ~80 us layer, however small: see
bench/results/layer_dispatch_costs_h100.txt); at M > 1 the op runs the rms_norm kernel into
scratch before its GEMM, and the CPU op calls the rms_norm kernel first. It fires only where
the norm has a weight and its output is read by exactly the linears of one such group or
SwiGLU pair (nothing else reads y, and y never leaves the partition). It computes the three
matches itself, so it fires whether those passes run or not, and it runs after them (PASSES
order): its rewrites replace theirs on the nodes it absorbs. The node that emitted the
rms_norm emits nothing; the group's op is emitted where it stood before and reads x, which
stays live up to it in the IR the memory planner sees.

Numerics: the fused op's norm is the rms_norm op's arithmetic in its order (the CPU kernel
itself; on WebGPU the same lane partials, tree, division, rsqrt and products as
normalization.wgsl, with every square-and-add an explicit fma in both), and each column is
then its unfused linear's, so the output is the unfused lowering's bit for bit (tested).
"""
from __future__ import annotations

from typing import Optional

import torch

from delegate.ops.q4gsw import lower_linear_multi, lower_linear_swiglu
from delegate.passes._match import is_call, lower_nothing as _lower_nothing
from delegate.passes import linear_swiglu, rms_norm
from delegate.passes.fuse_linear import _groups as _fused_groups

RMS_NORM = "aten.rms_norm.default"


def detect(graph) -> dict:
    # Matches never overlap: each norm's output feeds only the one group that absorbs it.
    groups = [g for x in graph.nodes for g in _fused_groups(x)]
    pairs = {frozenset(g) for g in groups if len(g) == 2}
    swiglus = {frozenset(m[:2]): (node, m) for node in graph.nodes
               if (m := linear_swiglu._match(node, pairs)) is not None}
    rewrites = {}
    for node in graph.nodes:
        norm = rms_norm._match(node) or _aten_rms_norm(node)
        if norm is None or norm[1] is None:
            continue
        x, weight, eps, last, absorbed = norm
        fused = _consumer(frozenset(last.users), groups, swiglus)
        if fused is not None:
            anchor, lower, taken = fused
            rewrites.update((n, _lower_nothing) for n in (*absorbed, last, *taken))
            rewrites[anchor] = lower((x, weight, eps))
    return rewrites


def _aten_rms_norm(node) -> Optional[tuple]:
    """rms_norm._match's tuple for an aten.rms_norm over the last dim of a contiguous float32
    x with a float32 [D] weight, else None (eps None is float32's machine epsilon, as the
    rms_norm op reads it)."""
    if not is_call(node, RMS_NORM) or len(node.args) < 2:
        return None
    x, shape = node.args[0], node.args[1]
    weight = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
    eps = node.args[3] if len(node.args) > 3 else node.kwargs.get("eps")
    d = rms_norm._row_dim(x) if isinstance(x, torch.fx.Node) else None
    if d is None or list(shape) != [d] or not isinstance(weight, torch.fx.Node):
        return None
    w = weight.meta.get("val")
    if not (isinstance(w, torch.Tensor) and w.dtype == torch.float32 and tuple(w.shape) == (d,)):
        return None
    return x, weight, torch.finfo(torch.float32).eps if eps is None else float(eps), node, ()


def _consumer(readers, groups, swiglus) -> Optional[tuple]:
    """(node that emits, lowering of a norm, nodes that emit nothing) when the norm's readers
    are exactly a SwiGLU pair's linears or one fuse_linear group's, else None."""
    if readers in swiglus:
        node, (gate, up, silu) = swiglus[readers]
        return node, lambda norm: _swiglu(gate, up, norm), (gate, up, *silu)
    for group in groups:
        if frozenset(group) == readers:
            return group[0], lambda norm: _multi(group, norm), tuple(group[1:])
    return None


def _multi(group, norm):
    def lower(ctx, node):
        lower_linear_multi(ctx, group, norm)

    return lower


def _swiglu(gate, up, norm):
    def lower(ctx, node):
        lower_linear_swiglu(ctx, gate, up, node, norm)

    return lower

"""Fuse a hand-written RMSNorm into one rms_norm (delegate/ops/normalization.py).

    s = x * x  |  pow(x, 2)            aten.mul.Tensor | aten.pow.Tensor_Scalar
    m = mean(s, [-1], keepdim=True)    aten.mean.dim
    a = m + eps                        aten.add.Tensor | aten.add.Scalar, either operand order
    r = rsqrt(a)                       aten.rsqrt.default
    n = x * r                          aten.mul.Tensor, either operand order
    y = n * w                          aten.mul.Tensor, either order; optional, w [D] float32
        ─► rms_norm(x, w or absent, normalized_shape=[D], eps)

This is ExecuTorch's Llama RMSNorm (x * x) and HF's LlamaRMSNorm (pow, whose fp32-to-fp32
casts export drops) as edge decomposes them. eps is a Python number or a 0-d program constant
(edge lifts the scalar of `m + eps` to one). The mean is over the last dim only, with keepdim;
x, s, m, a, r, n are float32 and x is contiguous with a static last dim D. It fires only
where s, m, a, r (and n, when the weight product is absorbed) each have their next node in the
chain as their only consumer, so none is read elsewhere or leaves the partition. A weight
product whose other operand is not a float32 [D] tensor stays its own mul after an rms_norm
without weight. The last node of the chain emits rms_norm and writes its own output; the
absorbed nodes emit nothing, and the eps constant never enters the IR.

Numerics. The fused kernels do the unfused chain's float32 operations in its order: square,
sum, divide by D, add eps, rsqrt, times x, times w. CPU: kernels_cpu/normalization.py calls the
same torch ops per row as the unfused mul, mean, add, rsqrt, mul, mul kernels, so the result
is bit-identical (tested). WebGPU: the rms_norm shader sums 128 lane-strided partials and
combines them in the same tree as the mean shader, then divides by D and adds eps; its one
freedom is that the square stays in a register, where a shader compiler may contract it with
the running sum into an fma (SPIR-V permits it), while unfused each square is rounded to
float32 in memory. That moves each positive term by at most half an ulp, the mean of squares
by at most 2^-24 relative, and (after rsqrt, two products and a possible one-ulp flip of
inverseSqrt) the output by a few 1e-7 relative: so the test asks 1e-6 of the unfused lowering
there, and lavapipe measures it bit-identical. eps must be a normal positive float32: then
mean + eps > 0 and the shader's rsqrt_of agrees with the unfused rsqrt_ieee (they differ only
at 0 and below, which WGSL leaves undefined for inverseSqrt). pow(x, 2) is fused as x * x,
which is what torch and the pow shader compute for an exponent of 2.
"""
from __future__ import annotations

from typing import Optional

import torch

from delegate.passes._match import (is_call as _is, lower_nothing as _lower_nothing,
                                    only_feeds as _only_feeds, product as _product)
from delegate.lowering import sym_text
from delegate.ops.export import constant_value, target_name

MUL = "aten.mul.Tensor"
POW = "aten.pow.Tensor_Scalar"
MEAN = "aten.mean.dim"
ADD = ("aten.add.Tensor", "aten.add.Scalar")
RSQRT = "aten.rsqrt.default"


def detect(graph) -> dict:
    # Matches never overlap: each anchor is the one x * rsqrt(...) its absorbed chain feeds.
    rewrites = {}
    for node in graph.nodes:
        match = _match(node)
        if match is not None:
            x, weight, eps, last, absorbed = match
            rewrites[last] = _lower_rms_norm(x, weight, eps)
            rewrites.update((n, _lower_nothing) for n in absorbed)
    return rewrites


def _square_of(node) -> Optional[torch.fx.Node]:
    """x when node is x * x or pow(x, 2), else None."""
    pair = _product(node)
    if pair is not None:
        return pair[0] if pair[0] is pair[1] else None
    if _is(node, POW) and len(node.args) == 2 and not node.kwargs:
        x, e = node.args
        if isinstance(x, torch.fx.Node) and not isinstance(e, bool) and e == 2:
            return x
    return None


def _is_last_dim_mean(node) -> bool:
    """mean(s, [-1], keepdim=True) with no dtype."""
    if not _is(node, MEAN) or set(node.kwargs) - {"keepdim"} or len(node.args) > 3:
        return False
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    dims = node.args[1] if len(node.args) > 1 else None
    rank = node.args[0].meta["val"].dim() if isinstance(node.args[0], torch.fx.Node) else 0
    return (keepdim is True and isinstance(dims, (list, tuple)) and len(dims) == 1
            and dims[0] in (-1, rank - 1) and rank > 0)


def _eps_of(value) -> Optional[float]:
    """A Python number, or the value of a 0-d real constant; else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    t = constant_value(value)
    if (isinstance(t, torch.Tensor) and t.dim() == 0 and t.dtype != torch.bool
            and not t.dtype.is_complex):
        return float(t.item())
    return None


def _mean_plus_eps(node) -> Optional[tuple]:
    """(m, eps) when node is m + eps (alpha 1) with eps a constant, else None."""
    if not _is(node, *ADD) or len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
        return None
    if set(node.kwargs) - {"alpha"}:
        return None
    for m, e in (node.args, node.args[::-1]):
        eps = _eps_of(e) if isinstance(m, torch.fx.Node) else None
        if eps is not None and torch.finfo(torch.float32).tiny <= eps < float("inf"):
            return m, eps
    return None


def _inverse_rms(r, user) -> Optional[tuple]:
    """(x, eps, absorbed) when r is rsqrt(mean(x^2, -1, keepdim) + eps), each node read only
    by the next one and r only by user; else None."""
    if not (_is(r, RSQRT) and len(r.args) == 1 and not r.kwargs and _only_feeds(r, user)):
        return None
    add = r.args[0]
    found = _mean_plus_eps(add) if _is(add, *ADD) and _only_feeds(add, r) else None
    if found is None:
        return None
    mean, eps = found
    if not (_is_last_dim_mean(mean) and _only_feeds(mean, add)):
        return None
    square = mean.args[0]
    x = _square_of(square)
    if x is None or not _only_feeds(square, mean):
        return None
    return x, eps, (square, mean, add, r)


def _row_dim(x) -> Optional[int]:
    """D, the static last dim of a contiguous float32 x; else None."""
    v = x.meta.get("val")
    if not (isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.dim() > 0):
        return None
    if tuple(v.dim_order()) != tuple(range(v.dim())):
        return None
    d = sym_text(v.shape[-1])
    return d if isinstance(d, int) and d > 0 else None


def _float32(*nodes) -> bool:
    vals = [n.meta.get("val") for n in nodes]
    return all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in vals)


def _weight_of(n, d: int) -> Optional[tuple]:
    """(w, y) when n's one consumer y is n * w with w a float32 [D] tensor, else None."""
    users = list(n.users)
    pair = _product(users[0]) if len(users) == 1 else None
    if pair is None:
        return None
    y = users[0]
    for a, w in (pair, pair[::-1]):
        if a is n and w is not n:
            v = w.meta.get("val")
            if (isinstance(v, torch.Tensor) and v.dtype == torch.float32
                    and tuple(sym_text(s) for s in v.shape) == (d,) and _float32(y)):
                return w, y
    return None


def _match(n) -> Optional[tuple]:
    """(x, weight or None, eps, node that emits, absorbed nodes) when n is x * rsqrt(...) of
    an RMSNorm we fuse, else None."""
    pair = _product(n)
    if pair is None:
        return None
    for x, r in (pair, pair[::-1]):
        found = _inverse_rms(r, n)
        if found is None or found[0] is not x:
            continue
        d = _row_dim(x)
        absorbed = found[2]
        if d is None or not _float32(*absorbed, n):
            return None
        weighted = _weight_of(n, d)
        if weighted is None:
            return x, None, found[1], n, absorbed
        return x, weighted[0], found[1], weighted[1], absorbed + (n,)
    return None


def _lower_rms_norm(x, weight, eps: float):
    def lower(ctx, node):
        ctx.emit("rms_norm", [ctx.tensor(x), ctx.optional_tensor(weight)], [ctx.output(node)],
                 normalized_shape=[ctx.dim(x.meta["val"].shape[-1])], eps=eps)

    return lower

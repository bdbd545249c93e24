"""Fuse a rotary embedding into one rope (delegate/ops/rope.py).

Meta's Llama (executorch examples/models/llama/rope.py apply_rotary_emb), as edge holds it:

    p = view(x, [..., D/2, 2]);  xr, xi = squeeze(slice(p, -1, 0, 1)), squeeze(slice(p, -1, 1, 2))
    view(cat([unsqueeze(xr*cos - xi*sin, -1), unsqueeze(xr*sin + xi*cos, -1)], -1), x.shape)
        ─► rope(x, cos, sin, style="interleaved", rotary_dim=D)       cos, sin [..., D/2]

HF rotate_half (transformers' Llama; executorch's hf_apply_rotary_emb, partial as in
GPT-NeoX and Qwen3.5):

    xr * cos + cat([-xr[..., R/2:], xr[..., :R/2]], -1) * sin                   (R = D)
    cat([that, x[..., R:]], -1) with xr = x[..., :R]                             (R < D)
        ─► rope(x, cos, sin, style="half", rotary_dim=R)              cos, sin [..., R]

Either operand order of every mul and of the add matches; the sub's does not. It fires only
where x, cos, sin and the result are float32 in contiguous dim order, x's last dim is static,
each product has x's (rotated) shape (the tables broadcast into it, never the other way),
and every absorbed intermediate has all its consumers inside the pattern and is not an
output. The root (the final view, cat or add) emits rope and writes its own output; the
absorbed nodes emit nothing. cos and sin stay tensor inputs: their views are shared by the
q and k rotations of a layer.

Two matches of the same cos and sin nodes, style and rotary_dim (a layer's q and k; their
head counts may differ) become one rope_pair, emitted at the later root and writing both
outputs; the earlier root emits nothing. They pair only where nothing reads the earlier
root's output before the later root; matches are paired in graph order, a leftover stays a
rope.
"""
from __future__ import annotations

import sys
from typing import Optional

import torch

from delegate.passes._match import (is_call as _is, lower_nothing as _lower_nothing,
                                    unread_before)
from delegate.lowering import sym_text
from delegate.ops.export import target_name

VIEW = "aten.view_copy.default"
SLICE = "aten.slice_copy.Tensor"
SQUEEZE = "aten.squeeze_copy.dims"
UNSQUEEZE = "aten.unsqueeze_copy.default"
CAT = "aten.cat.default"
MUL = "aten.mul.Tensor"
ADD = "aten.add.Tensor"
SUB = "aten.sub.Tensor"
NEG = "aten.neg.default"
ALIAS = "aten.alias_copy.default"


def detect(graph) -> dict:
    # Matches never overlap: every absorbed node feeds only nodes of its own match.
    rewrites = {}
    for group in groups(graph):
        for root, *_, absorbed in group:
            rewrites.update((n, _lower_nothing) for n in [root, *absorbed])
        rewrites[group[-1][0]] = lower_group(group)
    return rewrites


def groups(graph) -> list:
    """The matches in graph order, each alone or paired with the next match of the same cos
    and sin nodes, style and rotary_dim (a layer's q and k) where _pairable allows."""
    nodes = list(graph.nodes)
    place = {n: i for i, n in enumerate(nodes)}
    groups, unpaired = [], {}   # (cos, sin, style, rotary_dim) -> index in groups
    for node in nodes:
        match = _match_interleaved(node) or _match_half(node)
        if match is None:
            continue
        key = match[2:6]
        i = unpaired.pop(key, None)
        if i is not None and _pairable(groups[i][0], match, place):
            groups[i].append(match)
        else:
            unpaired[key] = len(groups)
            groups.append([match])
    return groups


def _pairable(first, second, place) -> bool:
    """The pair is emitted at the second root, so nothing may read the first root's output
    before it (this also keeps the second rotation from reading the first's)."""
    return unread_before(first[0], second[0], place)


# ---- node tests --------------------------------------------------------------------------------
def _feeds_only(node, users) -> bool:
    """node's consumers are exactly `users` (a partition output is a consumer too)."""
    return set(node.users) == set(users)


def _val(node):
    """node's example tensor (None for a non-node or a non-tensor value)."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _shape(node) -> tuple:
    return tuple(sym_text(s) for s in _val(node).shape)


def _last(dim, node) -> bool:
    """dim names the last dim of node's value."""
    rank = _val(node).dim() if _val(node) is not None else 0
    return isinstance(dim, int) and rank > 0 and dim % rank == rank - 1


def _operands(node, target: str) -> Optional[tuple]:
    """(a, b) of a binary op on two tensors (alpha 1 for add and sub), else None."""
    if not _is(node, target) or len(node.args) != 2:
        return None
    if set(node.kwargs) - {"alpha"} or node.kwargs.get("alpha", 1) != 1:
        return None
    a, b = node.args
    return (a, b) if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) else None


def _slice_of(node) -> Optional[tuple]:
    """(source, start, end) of a step-1 slice of the last dim with static bounds (clamped to
    the source's size, as torch does), else None."""
    if not _is(node, SLICE) or node.kwargs or not 2 <= len(node.args) <= 5:
        return None
    src, dim, start, end, step = tuple(node.args) + (None, None, 1)[len(node.args) - 2:]
    size = _val(src).shape[-1] if _val(src) is not None and _val(src).dim() else None
    if not (isinstance(size, int) and _last(dim, src) and step == 1):
        return None
    start, end = 0 if start is None else start, sys.maxsize if end is None else end
    if not (isinstance(start, int) and isinstance(end, int)):
        return None
    start, end = (min(max(b + size if b < 0 else b, 0), size) for b in (start, end))
    return src, start, end


def _cat_last(node, count: int) -> Optional[list]:
    """The parts of a cat of `count` tensors along the last dim, else None."""
    if not _is(node, CAT) or node.kwargs or len(node.args) not in (1, 2):
        return None
    parts, dim = node.args[0], node.args[1] if len(node.args) == 2 else 0
    if len(parts) != count or not _last(dim, node):
        return None
    return list(parts)


def _float32_contiguous(*nodes) -> bool:
    vals = [_val(n) for n in nodes]
    return all(v is not None and v.dtype == torch.float32
               and tuple(v.dim_order()) == tuple(range(v.dim())) for v in vals)


def _broadcasts_into(table, target_shape: tuple, width) -> bool:
    """table's shape broadcasts into target_shape (never widening it), last dim `width`."""
    t = _shape(table)
    if not 1 <= len(t) <= len(target_shape) or t[-1] != width:
        return False
    return all(a in (1, b) for a, b in zip(t, target_shape[len(target_shape) - len(t):]))


# ---- Meta's interleaved form -------------------------------------------------------------------
def _pair_member(node) -> Optional[tuple]:
    """(pair view, k, slice) when node is squeeze(slice(p, -1, k, k + 1), [-1]), else None."""
    if not _is(node, SQUEEZE) or len(node.args) != 2 or node.kwargs:
        return None
    sl, dims = node.args
    found = _slice_of(sl)
    if found is None or list(dims) not in ([-1], [_val(sl).dim() - 1]):
        return None
    p, start, end = found
    if end != start + 1 or start not in (0, 1) or _val(p).shape[-1] != 2:
        return None
    return p, start, sl


def _member_times(mul, k: int) -> Optional[tuple]:
    """(member, pair view, slice, table) when mul is member k of a pair times a table."""
    pair = _operands(mul, MUL)
    for a, b in (pair, pair[::-1]) if pair else ():
        found = _pair_member(a)
        if found is not None and found[1] == k:
            return a, found[0], found[2], b
    return None


def _match_interleaved(root) -> Optional[tuple]:
    if not _is(root, VIEW):
        return None
    cat = root.args[0]
    parts = _cat_last(cat, 2)
    if parts is None or not all(_is(u, UNSQUEEZE) and len(u.args) == 2 and _last(u.args[1], u)
                                for u in parts):
        return None
    u_r, u_i = parts
    sub, add = u_r.args[0], u_i.args[0]
    diff, total = _operands(sub, SUB), _operands(add, ADD)
    if diff is None or total is None or not all(_operands(m, MUL) for m in total):
        return None
    r_cos, i_sin = _member_times(diff[0], 0), _member_times(diff[1], 1)
    if r_cos is None or i_sin is None or r_cos[1] is not i_sin[1]:
        return None
    (xr, p, s0, cos), (xi, _, s1, sin) = r_cos, i_sin
    # the imaginary part: xr * sin + xi * cos, in any order
    if {frozenset(m.args) for m in total} != {frozenset((xr, sin)), frozenset((xi, cos))}:
        return None
    muls = [*diff, *total]
    absorbed = [p, s0, s1, xr, xi, *muls, sub, add, u_r, u_i, cat]
    x = p.args[0] if _is(p, VIEW) else None
    if x is None or any(t in absorbed for t in (x, cos, sin)) or len(set(muls)) != 4:
        return None
    consumers = [(p, [s0, s1]), (s0, [xr]), (s1, [xi]),
                 (xr, [m for m in muls if xr in m.args]), (xi, [m for m in muls if xi in m.args]),
                 *((m, [sub]) for m in diff), *((m, [add]) for m in total),
                 (sub, [u_r]), (add, [u_i]), (u_r, [cat]), (u_i, [cat]), (cat, [root])]
    if not all(_feeds_only(n, users) for n, users in consumers):
        return None
    if not _float32_contiguous(x, cos, sin, root):
        return None
    d, pairs = _val(x).shape[-1], _shape(xr)
    if not (isinstance(d, int) and d % 2 == 0 and _shape(p) == _shape(x)[:-1] + (d // 2, 2)
            and _shape(root) == _shape(x) and _shape(cos) == _shape(sin)
            and all(_shape(m) == pairs for m in muls) and _broadcasts_into(cos, pairs, d // 2)):
        return None
    return root, x, cos, sin, "interleaved", d, absorbed


# ---- HF rotate_half form -----------------------------------------------------------------------
def _rotate_half_of(node) -> Optional[tuple]:
    """(xr, absorbed) when node is cat([-xr[..., R/2:], xr[..., :R/2]], -1), else None."""
    parts = _cat_last(node, 2)
    if parts is None or not _is(parts[0], NEG) or len(parts[0].args) != 1:
        return None
    neg, lo = parts
    hi_found, lo_found = _slice_of(neg.args[0]), _slice_of(lo)
    if hi_found is None or lo_found is None or hi_found[0] is not lo_found[0]:
        return None
    xr, size = lo_found[0], _val(lo_found[0]).shape[-1]
    if size % 2 or lo_found[1:] != (0, size // 2) or hi_found[1:] != (size // 2, size):
        return None
    hi = neg.args[0]
    if not (_feeds_only(hi, [neg]) and _feeds_only(neg, [node]) and _feeds_only(lo, [node])):
        return None
    return xr, [hi, neg, lo, node]


def _rotation(add) -> Optional[tuple]:
    """(xr, cos, sin, absorbed, (xr * cos, rotate_half(xr) * sin)) when add is their sum."""
    terms = _operands(add, ADD)
    for m_cos, m_sin in (terms, terms[::-1]) if terms else ():
        by_cos, by_sin = _operands(m_cos, MUL), _operands(m_sin, MUL)
        if by_cos is None or by_sin is None or m_cos is m_sin:
            continue
        for rot, sin in (by_sin, by_sin[::-1]):
            found = _rotate_half_of(rot)
            if found is None or found[0] not in by_cos:
                continue
            xr, absorbed = found
            cos = by_cos[1] if by_cos[0] is xr else by_cos[0]
            if (cos is not xr and _feeds_only(m_cos, [add]) and _feeds_only(m_sin, [add])
                    and _feeds_only(rot, [m_sin])):
                return xr, cos, sin, absorbed + [m_cos, m_sin], (m_cos, m_sin)
    return None


def _wrapped(add, xr, muls, rotate_nodes) -> tuple:
    """(root, x, absorbed) of the copies edge may put around the rotation: a cat([add], -1)
    or a partial cat([add, x[..., R:]], -1) with xr = x[..., :R] after it, an alias_copy(x)
    (x[..., :D]) as xr before it. Each is absorbed only where the pattern alone reads it."""
    root, x, absorbed = add, xr, []
    inside = [muls[0], rotate_nodes[0], rotate_nodes[2]]   # xr * cos, and the two halves
    cat = next(iter(add.users)) if len(add.users) == 1 else None
    whole, parts = _cat_last(cat, 1), _cat_last(cat, 2)
    if whole == [add]:
        root, absorbed = cat, [add]
    elif parts is not None and parts[0] is add:
        head, tail = _slice_of(xr), _slice_of(parts[1])
        if (head is not None and tail is not None and head[0] is tail[0] and head[1] == 0
                and tail[1:] == (head[2], _val(head[0]).shape[-1])
                and _feeds_only(xr, inside) and _feeds_only(parts[1], [cat])):
            root, x, absorbed = cat, head[0], [xr, parts[1], add]
    if x is xr and _is(xr, ALIAS) and len(xr.args) == 1 and _feeds_only(xr, inside):
        x, absorbed = xr.args[0], absorbed + [xr]
    return root, x, absorbed


def _match_half(add) -> Optional[tuple]:
    found = _rotation(add)
    if found is None:
        return None
    xr, cos, sin, absorbed, muls = found
    root, x, more = _wrapped(add, xr, muls, absorbed)
    absorbed = absorbed + more
    if any(t in absorbed for t in (x, cos, sin)) or not _float32_contiguous(x, cos, sin, root):
        return None
    rd, d = _val(xr).shape[-1], _val(x).shape[-1]
    if not (isinstance(rd, int) and isinstance(d, int) and rd > 0 and rd % 2 == 0):
        return None
    rotated = _shape(xr)
    if not (_shape(root) == _shape(x) and _shape(cos) == _shape(sin)
            and all(_shape(m) == rotated for m in muls) and _broadcasts_into(cos, rotated, rd)):
        return None
    return root, x, cos, sin, "half", rd, absorbed


# ---- lowering ----------------------------------------------------------------------------------
def lower_group(group):
    """rope for one match; rope_pair, writing both roots' outputs, for two."""
    _, _, cos, sin, style, rotary_dim, _ = group[0]

    def lower(ctx, node):
        # inputs before outputs, as the single rope always made its value ids
        ins = [ctx.tensor(t) for t in [*(x for _, x, *_ in group), cos, sin]]
        outs = [ctx.output(root) for root, *_ in group]
        ctx.emit("rope" if len(group) == 1 else "rope_pair", ins, outs, style=style,
                 rotary_dim=rotary_dim)

    return lower

"""Scaled dot-product attention, kept whole from decomposition.

q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev] -> out [B, Hq, L, Ev].
    out = softmax(q @ k^T * scale + bias) @ v
bias comes from attn_mask (bool: False -> -inf; float: added) or, with is_causal, from torch's
top-left aligned tril(L, S). With enable_gqa, query head h reads kv head h // (Hq / Hkv).

Over a KV cache: only the first kv_len keys exist, and causal rows sit at causal_offset (query
row i sees keys j <= i + causal_offset). ExecuTorch's Llama masks the cache with rows
[pos, pos + L) of a causal buffer; the lowering turns that mask into causal_offset = pos and
kv_len = pos + L, so a decode step at position 127 reads 128 keys, not the whole cache.

Layouts: q_dims, k_dims and v_dims read inputs 0, 1 and 2 through a permutation (q =
input.permute(q_dims)), and out_dims writes the output through one (the stored output is
out.permute(out_dims)); empty: as is. All keep the head dim last, so each row of q, k, v and
of the output stays contiguous. They take Llama's q/k/v.transpose(1, 2) and the transpose back
into the attention (delegate/passes/sdpa_layout.py) without a copy of their own.
"""
from __future__ import annotations

import torch

from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops.export import register_pattern, target_name, through_permutes
from delegate.ops._common import arg, broadcast, claiming_device, one_input
from delegate.shape_math import SDPA_READ_DIMS

SDPA = "aten.scaled_dot_product_attention.default"

_MASK_DTYPES = (torch.bool, torch.float32)


def _layout(dims, rank: int = 4) -> list:
    """A q/k/v_dims or out_dims attribute as a permutation (empty: the identity), checked."""
    perm = list(dims or range(rank))
    expect(bool(perm) and sorted(perm) == list(range(rank)) and perm[-1] == rank - 1,
           DelegateError,
           "sdpa layout", f"a permutation of {rank} dims keeping the last", dims)
    return perm


def _infer_sdpa(in_shapes, attrs):
    one_input(in_shapes, 3)
    q, k, v = (tuple(s[i] for i in _layout(attrs.get(key), len(s)))   # as the kernel reads them
               for s, key in zip(in_shapes[:3], SDPA_READ_DIMS))
    mask = in_shapes[3] if len(in_shapes) > 3 else None
    for name, s in (("query", q), ("key", k), ("value", v)):
        expect(len(s) == 4, DelegateError, f"sdpa {name} rank", 4, f"{len(s)} {s}")
    expect(q[0] == k[0] == v[0], DelegateError, "sdpa batch", "equal sizes", (q[0], k[0], v[0]))
    expect(k[1] == v[1] and k[2] == v[2], DelegateError, "sdpa value heads and length",
           k[1:3], v[1:3])
    expect(q[3] == k[3], DelegateError, "sdpa key dim", q[3], k[3])
    heads_ok = q[1] == k[1] or (attrs.get("enable_gqa") and k[1] > 0 and q[1] % k[1] == 0)
    expect(heads_ok, DelegateError, "sdpa heads", f"kv heads dividing {q[1]} (enable_gqa) "
           "or equal", k[1])
    kv_len, offset = attrs.get("kv_len"), attrs.get("causal_offset", 0)
    expect(kv_len is None or 0 <= kv_len <= k[2], DelegateError, "sdpa kv_len",
           f"within [0, {k[2]}] keys", kv_len)
    expect(offset >= 0, DelegateError, "sdpa causal_offset", ">= 0", offset)
    if mask is not None:
        scores = (q[0], q[1], q[2], k[2])
        expect(broadcast(scores, mask) == scores, DelegateError, "sdpa attn_mask",
               f"broadcastable to {scores}", tuple(mask))
    out = (q[0], q[1], q[2], v[3])
    return [tuple(out[i] for i in _layout(attrs.get("out_dims")))]   # the output as stored


def _lower_sdpa(ctx, node):
    lower_sdpa(ctx, node)


def lower_sdpa(ctx, node, through=None, out=None, out_dims=()):
    """The sdpa of fx node `node`, reading operand i (0 q, 1 k, 2 v, as sdpa_operands finds
    them) from through[i] = (fx node, dims) as that node's value permuted by dims (default:
    the operand as is), and writing the value of fx node `out` through out_dims (default: its
    own)."""
    *operands, gqa = sdpa_operands(node)
    reads = [(through or {}).get(i, (x, ())) for i, x in enumerate(operands)]
    ins = [ctx.tensor(x) for x, _ in reads]
    mask = arg(node, 3, "attn_mask")
    causal, kv_len, offset = bool(arg(node, 5, "is_causal", False)), None, 0
    window = _cache_window(node, mask)
    if window is not None:   # rows of a causal buffer: no mask to read at all
        mask, causal, (offset, kv_len) = None, True, window
    ins.append(ctx.optional_tensor(mask))
    scale = arg(node, 6, "scale")
    layouts = {key: list(dims) for key, (_, dims) in zip(SDPA_READ_DIMS, reads)}
    ctx.emit("sdpa", ins, [ctx.output(node if out is None else out)], is_causal=causal,
             scale=None if scale is None else float(scale),
             enable_gqa=gqa, kv_len=kv_len,
             causal_offset=offset, **layouts, out_dims=list(out_dims))


def sdpa_operands(node) -> tuple:
    """(q, k, v, enable_gqa): the fx nodes the kernel reads for an sdpa node. k and v are
    the bases of their repeated heads where both repeat them alike (the kernel's GQA reads kv
    head h // rep: no copies), else the node's own arguments."""
    k, v, gqa = node.args[1], node.args[2], bool(arg(node, 7, "enable_gqa", False))
    bases = _repeated_heads(k), _repeated_heads(v)
    if all(b is not None for b in bases) and bases[0][1] == bases[1][1]:
        (k, _), (v, _) = bases
        gqa = True
    return node.args[0], k, v, gqa


def _repeated_heads(x):
    """(base, rep) when x [B, H*rep, S, D] is base [B, H, S, D] with each head repeated rep
    times in place (repeat_interleave(dim=1), as ExecuTorch's Llama and HF's repeat_kv build
    it: view(clone(expand(unsqueeze(base, 2), [B, H, rep, S, D])))), else None."""
    def producer(n, *names):
        ok = getattr(n, "op", None) == "call_function" and target_name(n.target) in names
        return n.args[0] if ok and len(n.users) == 1 else None

    expanded = producer(producer(x, "aten.view_copy.default", "aten._unsafe_view.default"),
                        "aten.clone.default", "dim_order_ops._clone_dim_order.default")
    base = producer(expanded, "aten.expand_copy.default")
    base = producer(base, "aten.unsqueeze_copy.default")
    if base is None or _arg_int(expanded.args[0], 1) != 2:   # unsqueeze(base, 2)
        return None
    b, e = base.meta["val"].shape, expanded.meta["val"].shape
    if len(b) != 4 or len(e) != 5 or [str(d) for d in e[:2]] != [str(b[0]), str(b[1])] or \
            [str(d) for d in e[3:]] != [str(d) for d in b[2:]] or not isinstance(e[2], int):
        return None
    return base, int(e[2])


def repeat_reader(x, reader):
    """The sdpa that reads fx node x as the base of its repeated k or v heads, where `reader`
    (one of x's users) starts that repeat, else None. The repeat's nodes then emit no
    dispatch (the sdpa reads x itself, so lowering drops them as dead): x's data is read
    where the sdpa stands, not where the repeat does."""
    chain = [reader]
    for _ in range(4):   # unsqueeze -> expand -> clone -> view -> the sdpa
        if len(chain[-1].users) != 1:
            return None
        chain.append(next(iter(chain[-1].users)))
    view, sdpa = chain[-2:]
    if sdpa.op != "call_function" or target_name(sdpa.target) != SDPA:
        return None
    _, k, v, _ = sdpa_operands(sdpa)   # it checks the chain is that repeat
    return sdpa if (k is x and sdpa.args[1] is view) or (v is x and sdpa.args[2] is view) \
        else None


def _arg_int(node, i):
    return node.args[i] if len(node.args) > i else None


def _cache_window(node, mask):
    """(pos, pos + L) when attn_mask is rows [pos, pos + L) of a constant causal bool buffer
    as wide as the keys (ExecuTorch's KV-cache mask), else None."""
    from delegate import host_values
    from delegate.ops.export import constant_value, target_name

    if getattr(mask, "op", None) != "call_function" or \
            target_name(mask.target) != "aten.slice_copy.Tensor":
        return None
    buf = constant_value(mask.args[0])
    dim, start = arg(mask, 1, "dim", 0), host_values.expr_of(arg(mask, 2, "start", 0) or 0)
    rows = node.args[0].meta["val"].shape[2]
    if buf is None or buf.dtype != torch.bool or buf.dim() != 2 or dim != 0 or start is None:
        return None
    if buf.shape[1] != node.args[1].meta["val"].shape[2] or arg(mask, 4, "step", 1) != 1:
        return None
    if not torch.equal(buf, torch.ones_like(buf).tril()):
        return None
    end = host_values.expr_of(arg(mask, 3, "end", None))
    want = host_values.plus(start, host_values.expr_of(rows))
    return (start, want) if end is not None and str(end) == str(want) else None


def _check_sdpa(node):
    if arg(node, 4, "dropout_p", 0.0) != 0.0:
        return f"dropout_p: expected 0, got {arg(node, 4, 'dropout_p')}"
    for i, name in enumerate(("query", "key", "value")):
        val = node.args[i].meta["val"]
        if val.dtype != torch.float32 or val.dim() != 4:
            return f"{name}: expected a 4-D float32 tensor, got {val.dim()}-D {val.dtype}"
    mask = arg(node, 3, "attn_mask")
    if mask is not None and mask.meta["val"].dtype not in _MASK_DTYPES:
        return f"attn_mask: expected bool or float32, got {mask.meta['val'].dtype}"
    if mask is not None and arg(node, 5, "is_causal", False):
        return "attn_mask with is_causal: expected one of them, got both"
    return _webgpu_head_dims(node) if claiming_device() == "webgpu" else None


def _webgpu_head_dims(node):
    """The WGSL kernel's head-dim limit; a blob claimed for cpu runs any head dim there."""
    from kernels_wgsl.attention import MAX_HEAD

    dims = (node.args[0].meta["val"].shape[-1], node.args[2].meta["val"].shape[-1])
    if not all(isinstance(d, int) and d <= MAX_HEAD for d in dims):
        return f"head dims on webgpu: expected static sizes of at most {MAX_HEAD}, got {dims}"
    return None


register_op("sdpa", (SDPA,), _infer_sdpa, _lower_sdpa,
            check=_check_sdpa, keep=(SDPA,),
            doc="softmax(q k^T * scale + mask) v; causal, masks, GQA; no dropout",
            attrs={"is_causal": "bool", "scale": "float?", "enable_gqa": "bool",
                   "kv_len": "symint?", "causal_offset": "symint", "q_dims": "ints",
                   "k_dims": "ints", "v_dims": "ints", "out_dims": "ints"}, arity=(4, 1))


# ExecuTorch's llama.custom_sdpa (source_transformation/sdpa.py): q [B, L, Hq, D] at positions
# start_pos.., k / v the whole cache [B, S_max, Hkv, D]; keys past start_pos + L are not yet
# written, and row i sees keys j <= start_pos + i. Lowered to one sdpa with kv_len =
# start_pos + L and causal_offset = start_pos that reads q, k and v as [B, H, S, D] through
# q/k/v_dims [0, 2, 1, 3] and writes its [B, L, H, D] output through out_dims: no copy of the
# cache per step. An operand that is itself the permute undoing the model's own transpose is
# read from that permute's input as is.
_CUSTOM_SDPA = "llama.custom_sdpa.default"
_HEADS_MAJOR = [0, 2, 1, 3]   # [B, S, H, D] <-> [B, H, S, D]


def _match_custom_sdpa(node):
    from delegate import host_values

    q, k, v = (a.meta["val"] for a in node.args[:3])
    if any(t.dtype != torch.float32 or t.dim() != 4 for t in (q, k, v)):
        return "q, k, v: expected 4-D float32 [B, S, H, D]"
    if host_values.expr_of(node.args[3]) is None:
        return "start_pos: expected a host-known position"
    if arg(node, 4, "attn_mask") is not None or arg(node, 5, "drpout_p", 0.0) != 0.0 or \
            not arg(node, 6, "is_causal", False):
        return "expected the causal form without mask or dropout"
    if q.shape[2] % k.shape[2] or k.shape[2] != v.shape[2]:
        return f"heads {q.shape[2]} / {k.shape[2]}: expected kv heads dividing query heads"
    return _webgpu_head_dims(node) if claiming_device() == "webgpu" else None


def _heads_major(ctx, x) -> tuple:
    """(value, dims) reading x [B, S, H, D] as [B, H, S, D] through the permutes that end at x
    (export.through_permutes): dims [] where they undo the model's own transpose."""
    base, dims = through_permutes(x)
    dims = [(dims or list(range(4)))[d] for d in _HEADS_MAJOR]
    return ctx.tensor(base), ([] if dims == sorted(dims) else dims)


def _lower_custom_sdpa(ctx, node):
    from delegate import host_values

    (q, q_dims), (k, k_dims), (v, v_dims) = (_heads_major(ctx, a) for a in node.args[:3])
    start = host_values.expr_of(node.args[3])
    rows = host_values.expr_of(node.args[0].meta["val"].shape[1])
    scale = arg(node, 7, "scale")
    ctx.emit("sdpa", [q, k, v, -1], [ctx.output(node)], is_causal=True,
             scale=None if scale is None else float(scale), enable_gqa=True,
             kv_len=host_values.plus(start, rows), causal_offset=start,
             q_dims=q_dims, k_dims=k_dims, v_dims=v_dims, out_dims=list(_HEADS_MAJOR))


register_pattern("sdpa", _CUSTOM_SDPA, _match_custom_sdpa, _lower_custom_sdpa,
                 doc="llama.custom_sdpa over a [B, S, H, D] cache")

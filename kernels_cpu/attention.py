"""Scaled dot-product attention CPU kernel, tiled over (batch, query head).

For each tile, in that worker's slice of the scratch arena:
    scores[L, S] = bias + scale * q[b, h] @ k[b, h // group]^T
    probs        = softmax(scores)            (rows with every key masked give 0, as torch)
    out[b, h]    = probs @ v[b, h // group]
Without a bias the `group` query heads that share a kv head form one tile of group * L rows
(one GEMM instead of `group`, which is what makes GQA decode cheap).
bias is a float attn_mask as given (broadcast view), or an additive 0 / -inf matrix built once
per call at the front of the scratch arena from a bool mask or from is_causal (torch's
top-left aligned tril: query i sees keys j <= i).
"""
from __future__ import annotations

import math

import torch

from kernels_cpu import register_kernel
from kernels_cpu.threadpool import get_pool, typed, worker_slices

aten = torch.ops.aten
_F32 = 4
# Below this many multiply-adds the whole call runs on one worker.
PARALLEL_MACS = 1 << 18


def _align(n: int) -> int:
    return (n + 63) // 64 * 64


def _shared_bias_shape(in_shapes, attrs):
    """Shape of the additive bias built in scratch, or None when none is needed."""
    q, k = in_shapes[0], in_shapes[1]
    mask = in_shapes[3] if len(in_shapes) > 3 else None
    if attrs.get("is_causal"):
        return (q[2], k[2])
    if mask is not None:
        return tuple(mask)
    return None


def _tile_bytes(in_shapes) -> int:
    """Scores and probs of the largest tile: all query heads of one kv head."""
    q, k = in_shapes[0], in_shapes[1]
    rows = q[2] * max(1, q[1] // max(k[1], 1))
    return _align(rows * k[2] * _F32) * 2


def sdpa_scratch_nbytes(in_shapes, attrs, num_workers: int) -> int:
    # the mask dtype is unknown here: reserve room for a bool mask's bias in any case
    bias = _shared_bias_shape(in_shapes, attrs)
    shared = 0 if bias is None else _align(math.prod(bias) * _F32)
    return shared + num_workers * _tile_bytes(in_shapes)


def _bias(mask, attrs, L: int, S: int, scratch):
    """(additive bias broadcastable to [B, H, L, S] or None, bytes of scratch it used)."""
    if attrs.get("is_causal"):
        bias = typed(scratch, torch.float32, (L, S))
        # 0 for keys j <= i + causal_offset, -inf above (torch's tril at offset 0)
        bias.fill_(float("-inf")).triu_(1 + attrs.get("causal_offset", 0))
        return bias, _align(L * S * _F32)
    if mask is None:
        return None, 0
    if mask.dtype != torch.bool:
        return mask, 0
    bias = typed(scratch, torch.float32, tuple(mask.shape))
    bias.fill_(float("-inf")).masked_fill_(mask, 0.0)
    return bias, _align(mask.numel() * _F32)


@register_kernel("sdpa", scratch_nbytes=sdpa_scratch_nbytes)
def sdpa(ins, outs, attrs, scratch):
    q, k, v = ins[0], ins[1], ins[2]
    mask = ins[3] if len(ins) > 3 else None
    if attrs.get("kv_len") is not None:   # only a cache's filled rows are keys
        n = attrs["kv_len"]
        k, v = k[:, :, :n], v[:, :, :n]
        mask = None if mask is None else mask[..., :n] if mask.shape[-1] > 1 else mask
    out = outs[0]
    B, Hq, L, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    group = Hq // Hkv
    scale = attrs.get("scale")
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    bias, used = _bias(mask, attrs, L, S, scratch)
    bias4 = None if bias is None else bias.expand(B, Hq, L, S)
    masked = mask is not None   # only a user mask can hide every key of a row

    grouped = bias4 is None
    heads, rows = (Hkv, group * L) if grouped else (Hq, L)
    pool = get_pool()
    tiles = B * heads
    workers = pool.num_threads if B * Hq * L * S * (E + v.shape[3]) >= PARALLEL_MACS else 1
    per = _tile_bytes([q.shape, k.shape])
    slices = worker_slices(scratch[used:], pool.num_threads, per)

    def work(w, t0, t1):
        scores = typed(slices[w], torch.float32, (rows, S))
        probs = typed(slices[w][per // 2:], torch.float32, (rows, S))
        for t in range(t0, t1):
            b, h = divmod(t, heads)
            if grouped:   # query heads h*group .. h*group+group-1 all read kv head h
                hk, qs = h, q[b, h * group:(h + 1) * group].reshape(rows, E)
                os = out[b, h * group:(h + 1) * group].view(rows, -1)
                torch.mm(qs, k[b, hk].t(), out=scores).mul_(scale)
            else:
                hk, os = h // group, out[b, h]
                torch.addmm(bias4[b, h], q[b, h], k[b, hk].t(), alpha=scale, out=scores)
            aten._softmax.out(scores, 1, False, out=probs)
            if masked:
                probs.nan_to_num_(nan=0.0)   # softmax of an all -inf row is nan; torch gives 0
            torch.mm(probs, v[b, hk], out=os)

    pool.parallel_for(tiles, work, min_chunk=max(1, tiles // workers))

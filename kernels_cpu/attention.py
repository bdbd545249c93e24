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
q_dims / out_dims: q is input 0 permuted, the output is stored permuted. q is read through
the view; a tile whose output rows are not contiguous there is formed in the tile's staging
rows and copied, since mm into strided rows rounds differently from mm into contiguous ones
(and MKL's by the 16-byte alignment of its output, which the staging rows copy: the results
are the plain layout's bit for bit).
"""
from __future__ import annotations

import math

import torch

from kernels_cpu import register_kernel
from kernels_cpu.threadpool import get_pool, typed, worker_slices

aten = torch.ops.aten
_F32 = 4
_STAGE_PHASES = 4   # floats per 16 bytes: the alignments a staged output tile may take
# Below this many multiply-adds the whole call runs on one worker.
PARALLEL_MACS = 1 << 18


def _align(n: int) -> int:
    return (n + 63) // 64 * 64


def _query_shape(in_shapes, attrs) -> tuple:
    """q [B, Hq, L, E] as the kernel reads it: input 0 through q_dims."""
    return tuple(in_shapes[0][i] for i in attrs.get("q_dims") or range(len(in_shapes[0])))


def _shared_bias_shape(in_shapes, attrs):
    """Shape of the additive bias built in scratch, or None when none is needed."""
    q, k = _query_shape(in_shapes, attrs), in_shapes[1]
    mask = in_shapes[3] if len(in_shapes) > 3 else None
    if attrs.get("is_causal"):
        return (q[2], k[2])
    if mask is not None:
        return tuple(mask)
    return None


def _tile_bytes(q, k, v, staged: bool) -> int:
    """Scores and probs of the largest tile (all query heads of one kv head), and its staged
    output rows when the output is permuted."""
    rows = q[2] * max(1, q[1] // max(k[1], 1))
    stage = _align(rows * v[3] * _F32 + _STAGE_PHASES * _F32) if staged else 0
    return _align(rows * k[2] * _F32) * 2 + stage


def sdpa_scratch_nbytes(in_shapes, attrs, num_workers: int) -> int:
    # the mask dtype is unknown here: reserve room for a bool mask's bias in any case
    bias = _shared_bias_shape(in_shapes, attrs)
    shared = 0 if bias is None else _align(math.prod(bias) * _F32)
    q, k, v = _query_shape(in_shapes, attrs), in_shapes[1], in_shapes[2]
    return shared + num_workers * _tile_bytes(q, k, v, bool(attrs.get("out_dims")))


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
    if attrs.get("q_dims"):
        q = q.permute(*attrs["q_dims"])
    mask = ins[3] if len(ins) > 3 else None
    if attrs.get("kv_len") is not None:   # only a cache's filled rows are keys
        n = attrs["kv_len"]
        k, v = k[:, :, :n], v[:, :, :n]
        mask = None if mask is None else mask[..., :n] if mask.shape[-1] > 1 else mask
    out = _logical_out(outs[0], attrs.get("out_dims"))
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
    staged = bool(attrs.get("out_dims"))
    per = _tile_bytes(q.shape, k.shape, v.shape, staged)
    slices = worker_slices(scratch[used:], pool.num_threads, per)
    half = _align(rows * S * _F32)

    def work(w, t0, t1):
        scores = typed(slices[w], torch.float32, (rows, S))
        probs = typed(slices[w][half:], torch.float32, (rows, S))
        for t in range(t0, t1):
            b, h = divmod(t, heads)
            if grouped:   # query heads h*group .. h*group+group-1 all read kv head h
                # (a copy of q's rows where q is permuted and L > 1)
                hk, h0, qs = h, h * group, q[b, h * group:(h + 1) * group].reshape(rows, E)
                dst = out[b, h * group:(h + 1) * group]
                torch.mm(qs, k[b, hk].t(), out=scores).mul_(scale)
            else:
                hk, h0, dst = h // group, h, out[b, h]
                torch.addmm(bias4[b, h], q[b, h], k[b, hk].t(), alpha=scale, out=scores)
            aten._softmax.out(scores, 1, False, out=probs)
            if masked:
                probs.nan_to_num_(nan=0.0)   # softmax of an all -inf row is nan; torch gives 0
            _form_rows(probs, v[b, hk], dst, slices[w][2 * half:], (b * Hq + h0) * L * v.shape[3])

    pool.parallel_for(tiles, work, min_chunk=max(1, tiles // workers))


def _form_rows(probs, vh, dst, region, first: int) -> None:
    """dst = probs @ vh for a tile's output rows dst ([rows, Ev], or [group, L, Ev]). Rows not
    contiguous in dst are formed in the staging region, at the 16-byte phase that the tile's
    first element (index `first`) has in a contiguous output, and copied."""
    if dst.is_contiguous():
        torch.mm(probs, vh, out=dst.view(probs.shape[0], -1))
        return
    at = first % _STAGE_PHASES * _F32
    stage = typed(region[at:], torch.float32, (probs.shape[0], vh.shape[1]))
    dst.copy_(torch.mm(probs, vh, out=stage).view(dst.shape))


def _logical_out(stored, out_dims):
    """The output [B, Hq, L, Ev] as a view of its stored layout, out.permute(out_dims)."""
    if not out_dims:
        return stored
    return stored.permute(*sorted(range(len(out_dims)), key=out_dims.__getitem__))

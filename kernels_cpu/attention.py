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
q_dims / k_dims / v_dims / out_dims: q, k and v are inputs 0, 1 and 2 permuted, the output
is stored permuted. q is read through the view; a tile whose output rows are not contiguous
there is formed in the tile's staging rows and copied, since mm into strided rows rounds
differently from mm into contiguous ones (and MKL's by the 16-byte alignment of its output,
which the staging rows copy: the results are the plain layout's bit for bit). A permuted k or
v head is copied into staging rows the same way before its mm: MKL's mm over a strided view
rounds differently from over the contiguous copy (a [S, 1] v, or E = 128 at S = 257).
"""
from __future__ import annotations

import itertools
import math

import torch

from delegate.shape_math import SDPA_READ_DIMS, sdpa_read_shapes
from kernels_cpu import register_kernel
from kernels_cpu.threadpool import get_pool, typed, worker_slices

aten = torch.ops.aten
_F32 = 4
_STAGE_PHASES = 4   # floats per 16 bytes: the alignments a staged output tile may take
# Below this many multiply-adds the whole call runs on one worker.
PARALLEL_MACS = 1 << 18


def _align(n: int) -> int:
    return (n + 63) // 64 * 64


def _shared_bias_shape(in_shapes, attrs):
    """Shape of the additive bias built in scratch, or None when none is needed."""
    q, k, _ = sdpa_read_shapes(in_shapes, attrs)
    mask = in_shapes[3] if len(in_shapes) > 3 else None
    if attrs.get("is_causal"):
        return (q[2], k[2])
    if mask is not None:
        return tuple(mask)
    return None


def _staging(n: int) -> int:
    """Bytes of staging rows for n floats at any of the 16-byte phases."""
    return _align(n * _F32 + _STAGE_PHASES * _F32)


def _tile_layout(q, k, v, attrs) -> tuple:
    """(byte offsets of scores, probs, staged output rows, staged k head, staged v head; the
    bytes of it all) in a worker's slice, for the largest tile (all query heads of one kv
    head). A staging region is empty where that operand is not permuted."""
    rows = q[2] * max(1, q[1] // max(k[1], 1))
    sizes = (_align(rows * k[2] * _F32), _align(rows * k[2] * _F32),
             _staging(rows * v[3]) if attrs.get("out_dims") else 0,
             _staging(k[2] * k[3]) if attrs.get("k_dims") else 0,
             _staging(v[2] * v[3]) if attrs.get("v_dims") else 0)
    *offsets, total = itertools.accumulate(sizes, initial=0)
    return offsets, total


def sdpa_scratch_nbytes(in_shapes, attrs, num_workers: int) -> int:
    # the mask dtype is unknown here: reserve room for a bool mask's bias in any case
    bias = _shared_bias_shape(in_shapes, attrs)
    shared = 0 if bias is None else _align(math.prod(bias) * _F32)
    return shared + num_workers * _tile_layout(*sdpa_read_shapes(in_shapes, attrs), attrs)[1]


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
    q, k, v = (x.permute(*attrs[key]) if attrs.get(key) else x
               for x, key in zip(ins, SDPA_READ_DIMS))
    mask = ins[3] if len(ins) > 3 else None
    stored_keys = k.shape[2]   # a head's rows in a contiguous k or v (a staged head's phase)
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
    (at_scores, at_probs, at_out, at_k, at_v), per = _tile_layout(q.shape, k.shape, v.shape,
                                                                   attrs)
    slices = worker_slices(scratch[used:], pool.num_threads, per)

    def work(w, t0, t1):
        scores = typed(slices[w][at_scores:], torch.float32, (rows, S))
        probs = typed(slices[w][at_probs:], torch.float32, (rows, S))
        held = None   # the (batch, kv head) of kh and vh: a worker's tiles run in order
        for t in range(t0, t1):
            b, h = divmod(t, heads)
            hk = h if grouped else h // group
            if held != (b, hk):
                first = (b * Hkv + hk) * stored_keys
                kh = _head(k, b, hk, attrs.get("k_dims"), slices[w][at_k:], first * E)
                vh = _head(v, b, hk, attrs.get("v_dims"), slices[w][at_v:],
                           first * v.shape[3])
                held = (b, hk)
            if grouped:   # query heads h*group .. h*group+group-1 all read kv head h
                # (a copy of q's rows where q is permuted and L > 1)
                h0, qs = h * group, q[b, h * group:(h + 1) * group].reshape(rows, E)
                dst = out[b, h * group:(h + 1) * group]
                torch.mm(qs, kh.t(), out=scores).mul_(scale)
            else:
                h0, dst = h, out[b, h]
                torch.addmm(bias4[b, h], q[b, h], kh.t(), alpha=scale, out=scores)
            aten._softmax.out(scores, 1, False, out=probs)
            if masked:
                probs.nan_to_num_(nan=0.0)   # softmax of an all -inf row is nan; torch gives 0
            _form_rows(probs, vh, dst, slices[w][at_out:], (b * Hq + h0) * L * v.shape[3])

    pool.parallel_for(tiles, work, min_chunk=max(1, tiles // workers))


def _phased(region, first: int, shape) -> torch.Tensor:
    """Contiguous float rows in a staging region, at the 16-byte phase that element `first`
    of a contiguous tensor has."""
    return typed(region[first % _STAGE_PHASES * _F32:], torch.float32, tuple(shape))


def _head(x, b: int, hk: int, dims, region, first: int) -> torch.Tensor:
    """Head hk of batch b of k or v, [S, E]: the view itself, or where x is read through a
    permute (dims) its copy in the staging region, as the contiguous operand would hold it
    (its first element is index `first` there)."""
    if not dims:
        return x[b, hk]
    return _phased(region, first, x.shape[2:]).copy_(x[b, hk])


def _form_rows(probs, vh, dst, region, first: int) -> None:
    """dst = probs @ vh for a tile's output rows dst ([rows, Ev], or [group, L, Ev]). Rows not
    contiguous in dst are formed in the staging region, at the 16-byte phase that the tile's
    first element (index `first`) has in a contiguous output, and copied."""
    if dst.is_contiguous():
        torch.mm(probs, vh, out=dst.view(probs.shape[0], -1))
        return
    stage = _phased(region, first, (probs.shape[0], vh.shape[1]))
    dst.copy_(torch.mm(probs, vh, out=stage).view(dst.shape))


def _logical_out(stored, out_dims):
    """The output [B, Hq, L, Ev] as a view of its stored layout, out.permute(out_dims)."""
    if not out_dims:
        return stored
    return stored.permute(*sorted(range(len(out_dims)), key=out_dims.__getitem__))

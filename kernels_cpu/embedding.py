"""Embedding CPU kernels: a row gather, out[i, :] = weight[indices[i], :]; embedding_bag, the
sum / mean / max of each bag of gathered rows (torch's own kernel)."""
from __future__ import annotations

import torch

from delegate.errors import InputError
from kernels_cpu import register_kernel


def _rows(indices: torch.Tensor, vocab: int) -> torch.Tensor:
    flat = indices.reshape(-1)
    if flat.numel():
        lo, hi = (int(v) for v in torch.aminmax(flat))
        # an out-of-range token id is bad input, not a crash inside torch
        if lo < 0 or hi >= vocab:
            raise InputError(f"embedding index: expected in [0, {vocab}), got {lo if lo < 0 else hi}")
    return flat


@register_kernel("embedding")
def embedding(ins, outs, attrs, scratch):
    weight, indices = ins[0], ins[1]
    vocab, dim = weight.shape
    torch.index_select(weight, 0, _rows(indices, vocab), out=outs[0].view(-1, dim))


@register_kernel("embedding_q4gsw")
def embedding_q4gsw(ins, outs, attrs, scratch):
    """out[i, d] = (nibble d of packed row idx[i] - 8) * scales[d / gs, idx[i]]."""
    packed, scales, indices = ins
    vocab, dim, gs = attrs["V"], attrs["D"], attrs["group_size"]
    rows = _rows(indices, vocab)
    nib = packed.index_select(0, rows).view(torch.uint8)          # [n, D/2]: k even low
    q = torch.stack((nib & 0xF, nib >> 4), dim=-1).reshape(-1, dim).to(torch.float32) - 8
    s = scales.index_select(1, rows).t().repeat_interleave(gs, dim=1)   # [n, D]
    torch.mul(q, s, out=outs[0].view(-1, dim))


@register_kernel("embedding_bag")
def embedding_bag(ins, outs, attrs, scratch):
    weight, indices, offsets = ins
    mode = ("sum", "mean", "max").index(attrs["mode"])
    rows = _rows(indices, weight.shape[0]).long()   # torch wants one index dtype for both
    bags = torch.ops.aten._embedding_bag(weight, rows, offsets.long(), False, mode, False, None,
                                         False, attrs["padding_idx"])[0]
    outs[0].copy_(bags)

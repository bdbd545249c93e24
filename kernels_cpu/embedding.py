"""Embedding CPU kernel: a row gather, out[i, :] = weight[indices[i], :]."""
from __future__ import annotations

import torch

from delegate.errors import InputError
from kernels_cpu import register_kernel


@register_kernel("embedding")
def embedding(ins, outs, attrs, scratch):
    weight, indices = ins[0], ins[1]
    vocab, dim = weight.shape
    flat = indices.reshape(-1)
    if flat.numel():
        lo, hi = (int(v) for v in torch.aminmax(flat))
        # an out-of-range token id is bad input, not a crash inside torch
        if lo < 0 or hi >= vocab:
            raise InputError(f"embedding index: expected in [0, {vocab}), got {lo if lo < 0 else hi}")
    torch.index_select(weight, 0, flat, out=outs[0].view(-1, dim))

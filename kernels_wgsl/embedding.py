"""Embedding (embedding.wgsl): one thread per output element gathers its weight entry."""
from __future__ import annotations

from kernels_wgsl import Dispatch, groups, numel, register_wgsl, words

WG = 256


@register_wgsl("embedding")
def embedding(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        vocab, dim = ins[0]
        n = numel(outs[0])
        return words(n, dim, vocab), groups(n, WG)

    return [Dispatch("embedding", "embedding", (0, 1, 2), (2,), sizes, label="embedding")]

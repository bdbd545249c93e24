"""Embedding (embedding.wgsl): one thread per output element gathers its weight entry;
embedding_q4gsw dequantizes its nibble from linear_q4gsw's packed layout on the way;
embedding_bag reduces its bag's entries of one weight column."""
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


@register_wgsl("embedding_q4gsw")
def embedding_q4gsw(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        n = numel(outs[0])
        v_pad = ins[1][1]
        return words(n, attrs["D"], attrs["V"], attrs["group_size"], v_pad), groups(n, WG)

    return [Dispatch("embedding", "embedding_q4gsw", (0, 1, 2, 3), (3,), sizes,
                     label="embedding_q4gsw")]


@register_wgsl("embedding_bag")
def embedding_bag(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        vocab, dim = ins[0]
        n = numel(outs[0])
        mode = ("sum", "mean", "max").index(attrs["mode"])
        return (words(n, dim, vocab, ins[1][0], ins[2][0], mode, attrs["padding_idx"]),
                groups(n, WG))

    return [Dispatch("embedding", "embedding_bag", (0, 1, 2, 3), (3,), sizes,
                     label="embedding_bag")]

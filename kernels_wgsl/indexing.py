"""Advanced indexing (indexing.wgsl): index, which index_select lowers to as well.

One dispatch, one thread per output element. The host lays the gather out per execute: the
output's shape, x's strides along the dims it keeps (0 along the index block), each index
tensor's strides broadcast into the block (0 outside it), and the stride and size of the dim
each index tensor picks. An index outside its dim writes 0 (delegate/ops/indexing.py).
"""
from __future__ import annotations

from delegate.errors import UnsupportedError
from delegate.shape_math import index_block_start
from kernels_wgsl import (Dispatch, broadcast_strides, contiguous_strides, groups, numel,
                          padded, register_wgsl, words)

WG = 256
MAX_INDICES = 4   # index bindings: with x, out and the params, within 8 storage buffers
PRELUDE = f"const MAX_INDICES: u32 = {MAX_INDICES}u;"


def index_layout(x, indices, out) -> list:
    """The IndexParams words after (n, rank, count, wrap)."""
    indexed = [d for d, s in enumerate(indices) if s is not None]
    at = index_block_start(indexed)
    block_rank = len(out) - (len(x) - len(indexed))
    block = out[at:at + block_rank]
    own = contiguous_strides(x)
    kept = [own[d] for d in range(len(x)) if d not in indexed]
    x_strides = kept[:at] + [0] * block_rank + kept[at:]
    tail = [0] * (len(out) - at - block_rank)
    index_strides = [[0] * at + broadcast_strides(indices[d], block) + tail for d in indexed]
    index_strides += [[]] * (MAX_INDICES - len(indexed))
    return [padded(out), padded(x_strides), *(padded(s) for s in index_strides),
            padded([own[d] for d in indexed], MAX_INDICES),
            padded([x[d] for d in indexed], MAX_INDICES)]


@register_wgsl("index")
def index(ins, outs, attrs, info):
    given = [1 + j for j, s in enumerate(ins[1:]) if s is not None]
    if len(given) > MAX_INDICES:
        raise UnsupportedError(f"index tensors on webgpu: expected at most {MAX_INDICES}, got "
                               f"{len(given)}")
    slots = tuple(given) + (0,) * (MAX_INDICES - len(given))   # x in unused slots: never read

    def sizes(ins, outs, attrs):
        n = numel(outs[0])
        return words(n, len(outs[0]), len(given), int(attrs["wrap"]),
                     *index_layout(ins[0], ins[1:], outs[0])), groups(n, WG)

    out = len(ins)
    return [Dispatch("indexing", "index_gather", (0,) + slots + (out,), (out,), sizes,
                     label="index", prelude=PRELUDE)]

"""Scaled dot-product attention (attention.wgsl): flash attention with flash-decoding splits.

Prefill: one workgroup per (batch, kv head, tile of BR query rows), K/V tiles of BC keys in
workgroup memory, online softmax, causal key tiles above the diagonal skipped. Decode (live
L <= DECODE_L): the keys are also split over workgroups, which write (m, l, acc) partials to a
scratch buffer that a combine pass merges. Without executor scratch support, decode runs as
prefill does (one pass, splits = 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from delegate.errors import UnsupportedError
from kernels_wgsl import Dispatch, broadcast_strides, groups, register_wgsl, words

MAX_HEAD = 256
DIMS_PER_THREAD = 32      # a thread's q slice and accumulator slice stay in registers
DEFAULT_WG_STORAGE = 16384
DECODE_L = 8              # live query lengths up to this split the key range (flash-decoding)
SPLIT_KEYS = 64           # aim of keys per split
MAX_SPLITS = 64
PARTIAL_FIELDS = 2        # (m, l) before each partial accumulator row


@dataclass(frozen=True)
class FlashTile:
    g: int       # threads per query row
    vec: int     # vec4s of head dims per thread
    br: int      # query rows per workgroup
    bc: int      # keys per tile

    @property
    def threads(self) -> int:
        return self.br * self.g

    def prelude(self) -> str:
        partial = self.bc * self.threads if self.g > 1 else 1
        return "\n".join(f"const {n}: u32 = {x}u;" for n, x in
                         (("G", self.g), ("VEC", self.vec), ("BR", self.br), ("BC", self.bc),
                          ("PARTIAL", partial)))


def shared_floats(g: int, vec: int, br: int, bc: int) -> int:
    """Workgroup floats: K and V tiles (bc padded rows each) plus the partial dot products."""
    return 2 * bc * g * vec * 4 + (bc * br * g if g > 1 else 0)


def flash_tile(e: int, ev: int, storage_bytes: int) -> FlashTile:
    """The tile for head dims (e, ev) that fits `storage_bytes` of workgroup memory."""
    dims = max(e, ev, 1)
    g = groups(dims, DIMS_PER_THREAD)
    vec = groups(groups(dims, g), 4)
    br = 64 if g <= 2 else 128 // g
    for bc in (32, 16, 8, 4, 2, 1):
        if shared_floats(g, vec, br, bc) * 4 <= storage_bytes:
            return FlashTile(g, vec, br, bc)
    raise UnsupportedError(f"sdpa tile on WebGPU: expected head dims fitting {storage_bytes} "
                           f"bytes of workgroup memory, got E={e}, Ev={ev}")


def key_splits(l: int, s: int, split: bool, bc: int) -> tuple:
    """(splits, keys per split): decode rows split the keys; everything else takes one pass."""
    if not split or l > DECODE_L or s <= SPLIT_KEYS:
        return 1, max(s, 1)
    n = min(MAX_SPLITS, groups(s, SPLIT_KEYS))
    per = groups(groups(s, n), bc) * bc
    return groups(s, per), per


def partials_bytes(ins, split: bool, bc: int) -> int:
    """Scratch for the decode partials at the upper-bound shapes (0 when not split)."""
    (b, hq, l, _), (_, _, s, ev) = ins[0], ins[2]
    splits, _ = key_splits(min(l, DECODE_L), s, split, bc)
    if splits == 1:
        return 0
    return b * hq * min(l, DECODE_L) * splits * (ev + PARTIAL_FIELDS) * 4


@register_wgsl("sdpa")
def sdpa(ins, outs, attrs, info):
    q, v, mask = ins[0], ins[2], ins[3] if len(ins) > 3 else None
    if q[3] > MAX_HEAD or v[3] > MAX_HEAD:
        raise UnsupportedError(f"sdpa head dims on WebGPU: expected at most {MAX_HEAD}, "
                               f"got E={q[3]}, Ev={v[3]}")
    storage = info.gpu.limits.get("max-compute-workgroup-storage-size", DEFAULT_WG_STORAGE)
    tile = flash_tile(q[3], v[3], storage)
    scratch = partials_bytes(ins, info.scratch, tile.bc)
    split = scratch > 0
    mask_kind = 0 if mask is None else (1 if info.in_dtypes[3] == torch.bool else 2)

    def params(ins, attrs):
        (b, hq, l, e), (_, hkv, s, ev) = ins[0], ins[2]
        scale = attrs.get("scale")
        scale = 1.0 / math.sqrt(e) if scale is None else float(scale)
        mstrides = broadcast_strides(ins[3], (b, hq, l, s)) if mask is not None else [0] * 4
        n_rep = hq // hkv if hkv else 0
        keys = s if attrs.get("kv_len") is None else min(s, attrs["kv_len"])
        splits, per = key_splits(l, keys, split, tile.bc)
        tiles = groups(n_rep * l, tile.br)
        packed = words(b, hq, hkv, l, s, e, ev, n_rep, scale, tiles, splits, per,
                       keys, attrs.get("causal_offset", 0), 0, 0, mstrides)
        return packed, b * hkv * tiles * splits if ev else 0, splits

    def flash_sizes(ins, outs, attrs):
        packed, count, _ = params(ins, attrs)
        return packed, count

    def combine_sizes(ins, outs, attrs):
        packed, _, splits = params(ins, attrs)
        (b, hq, l, _), ev = ins[0], ins[2][3]
        return packed, b * hq * l if splits > 1 and ev else 0

    m_arg = 3 if mask is not None else None
    # the partials' scratch operand; one pass never writes it, so the output stands in
    scr = len(ins) + len(outs) if split else 4
    consts = (("MASK", mask_kind), ("CAUSAL", int(bool(attrs.get("is_causal")))))
    extra = {"prelude": tile.prelude(), "scratch": (scratch,) if split else ()}
    flash = Dispatch("attention", "flash", (0, 1, 2, m_arg, 4, scr), (4, scr), flash_sizes,
                     consts, label="sdpa_flash", **extra)
    if not split:
        return [flash]
    combine = Dispatch("attention", "combine", (None, None, None, None, 4, scr), (4, scr),
                       combine_sizes, consts, label="sdpa_combine", **extra)
    return [flash, combine]

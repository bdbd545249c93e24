"""Scaled dot-product attention (attention.wgsl): flash attention with flash-decoding splits.

Prefill (`prefill`): one workgroup per (batch, kv head, tile of P_BR query rows, split of the
keys), a thread per 4 x 4 block of scores formed as outer products, K^T/V tiles of P_BC keys in
workgroup memory with each thread's first loads fetched a phase ahead, online softmax, causal
key tiles above the diagonal skipped; PREFILL_TILES in order, the first that fits the adapter's
workgroup storage. Head dims where none fits (E = 256; E = 128 on 32 KiB) take `flash`, one row
per thread group, in one split.
Decode (`decode`, live L <= DECODE_L): one workgroup per (batch, kv head, RB query rows, split
of the keys), one key per thread, so a short query keeps every lane busy.
Splits (key_splits): with several, each workgroup writes an (m, l, acc) partial per row to
scratch and `combine` merges them. Decode aims at SPLIT_KEYS keys a split; prefill at
PREFILL_SPLIT_KEYS in whole key tiles, so the few row tiles of a short prompt still fill the
GPU, with its partials at most PREFILL_PARTIALS_BYTES. Without executor scratch support both
take one split. Which kernel runs is decided per execute by the live L; a graph whose L bound
is at most DECODE_L builds only the decode kernel.
Decode splits the cache's whole key range (S), not the live keys (kv_len, an offset of the
LLM's KV cache): splits past kv_len hold no key and weigh 0 in combine (the same bits as
not launching them), so a decode binding's grids never move with the position and its
finished command buffers stay valid from one token to the next (Dispatch.fixed_grid).
q_dims / k_dims / v_dims / out_dims (q, k and v read through a permutation, the output written
through one, the head dim last in each): every entry finds a row of q, k, v and of the output
by its element strides in the params, so the rows stay contiguous and vec4 loads stay.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from delegate.errors import UnsupportedError
from delegate.shape_math import SDPA_READ_DIMS, sdpa_read_shapes
from kernels_wgsl import (Dispatch, broadcast_strides, contiguous_strides, groups,
                          register_wgsl, words)

MAX_HEAD = 256
DIMS_PER_THREAD = 32      # a thread's q slice and accumulator slice stay in registers
DEFAULT_WG_STORAGE = 16384
DECODE_L = 8              # live query lengths up to this split the key range (flash-decoding)
SPLIT_KEYS = 64           # aim of keys per decode split
PREFILL_SPLIT_KEYS = 128  # aim of keys per prefill split (rounded up to whole key tiles)
PREFILL_PARTIALS_BYTES = 64 << 20   # the most scratch the prefill partials grow to
# Prefill splits only a grid of fewer unsplit workgroups than this (two per SM of a 132-SM
# H100/H200). H100, bench/kernels.py, causal T=512, 32 heads, d=64: the 256-workgroup grid
# unsplit 9.17 TF/s, in 4 splits (+ combine) 5.74; with every head's last tile first the
# causal tiles' unequal lengths already even out over a grid this size.
PREFILL_MIN_GRID = 256
MAX_SPLITS = 64          # at most combine's lanes (attention.wgsl COMBINE_LANES)
PARTIAL_FIELDS = 2        # (m, l) before each partial accumulator row
DECODE_ROWS = 4           # query rows per decode workgroup (a GQA group of 4 at L = 1): the
                          # kernel holds them as the 4 components of vec4s, so exactly 4
DECODE_CHUNK = 64         # decode threads, keys per chunk


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


@dataclass(frozen=True)
class DecodeTile:
    de4: int     # vec4s of a q/k row
    dv4: int     # vec4s of a v row
    rb: int = DECODE_ROWS
    chunk: int = DECODE_CHUNK

    @property
    def cw(self) -> int:
        """Column slots: the value row's vec4s rounded up to a power of 2 dividing the chunk."""
        return min(self.chunk, 1 << max(0, self.dv4 - 1).bit_length())

    def prelude(self) -> str:
        return "\n".join(f"const {n}: u32 = {x}u;" for n, x in
                         (("RB", self.rb), ("DE4", self.de4), ("DV4", self.dv4), ("CW", self.cw),
                          ("KG", self.chunk // self.cw), ("CHUNK", self.chunk)))


# (rows, keys), the most work per barrier first; a tile's threads are (rows / 4) x (keys / 4)
# bench/sdpa_tiles.py on the H100 (causal T=512 32/32 d=64, TF/s): (64, 32) 9.09, (32, 32)
# 8.00, (32, 64) 6.98, (64, 16) 5.31, (16, 32) 4.46, (16, 128) 3.76, (16, 64) 2.81
PREFILL_TILES = ((64, 32), (32, 32), (16, 32))
UNUSED_TILE = (16, 32)    # the prefill arrays' sizes in a module whose prefill never runs


@dataclass(frozen=True)
class PrefillTile:
    br: int      # query rows per workgroup
    bc: int      # keys per tile
    de4: int
    dv4: int

    @property
    def threads(self) -> int:
        """One per 4 x 4 block of a tile's scores."""
        return self.br * self.bc // 16

    @property
    def oj(self) -> int:
        """Value vec4s per thread and row: the bc / 4 column groups cover a v row."""
        return groups(self.dv4, self.bc // 4)

    def bytes(self) -> int:
        """Q^T, the shared K^T / V region, P and the per-thread row maxima / sums."""
        return 16 * (self.br * self.de4 + self.bc * max(self.de4, self.dv4)
                     + self.bc * self.br // 4 + self.threads)

    def prelude(self) -> str:
        return "\n".join(f"const {n}: u32 = {x}u;" for n, x in
                         (("P_BR", self.br), ("P_BC", self.bc), ("P_T", self.threads),
                          ("P_OJ", self.oj)))


def prefill_tile(e: int, ev: int, storage_bytes: int) -> PrefillTile | None:
    """The register-blocked prefill tile for head dims (e, ev), None where none fits (the
    one-row-per-thread `flash` then runs)."""
    for br, bc in PREFILL_TILES:
        tile = PrefillTile(br, bc, groups(e, 4), groups(ev, 4))
        # the kernel's accumulators hold up to 4 column vec4s per row
        if tile.oj <= 4 and tile.bytes() <= storage_bytes:
            return tile
    return None


def loaders(e: int, ev: int) -> str:
    """WGSL: qkv_t, load_q(row, vec4 index) and load_k/v(a row's first element, vec4 index),
    zeros past the head dims. vec4 loads where both head dims are multiples of 4 (one
    unconditional load the compiler can issue ahead), else 4 guarded f32 loads. A q row is
    found by its strides (row_at), a k or v row by the caller (its strides in the params)."""
    vec = e % 4 == 0 and ev % 4 == 0
    out = [f"alias qkv_t = {'vec4<f32>' if vec else 'f32'};"]
    for name, dim, d4 in (("q", "e", "DE4"), ("k", "e", "DE4"), ("v", "ev", "DV4")):
        # the row's first element; a multiple of 4 wherever the head dims are, since each
        # operand's head dim stays last (its strides are multiples of it)
        row, at = ("row", "row_at(row, p.q_strides)") if name == "q" else ("first", "first")
        if vec:
            body = (f"let at = {at} / 4u; "
                    f"return select(vec4<f32>(0.0), {name}[at + c4], c4 < {d4});")
        else:
            body = (f"let at = {at}; "
                    f"var r = vec4<f32>(0.0); for (var i = 0u; i < 4u; i = i + 1u) {{ "
                    f"let c = c4 * 4u + i; "
                    f"if (c < p.{dim}) {{ r[i] = {name}[at + c]; }} }} "
                    f"return r;")
        out.append(f"fn load_{name}({row}: u32, c4: u32) -> vec4<f32> {{ {body} }}")
    return "\n".join(out)


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


def key_splits(l: int, keys: int, rows: int, ev: int, bc: int, held=None, grid: int = 0) -> tuple:
    """(splits, keys per split) over `keys` keys for `rows` output rows of ev values, for the
    kernel live L picks: decode (l <= DECODE_L) aims at SPLIT_KEYS keys a split in whole
    chunks, prefill at PREFILL_SPLIT_KEYS in whole key tiles of bc (0: its kernel never
    splits), so a split starts on a tile, and only as far as a grid of `grid` unsplit
    workgroups falls short of PREFILL_MIN_GRID. `held`: bytes of scratch the partials may fill
    (0: none bound, one pass); None while sizing the scratch."""
    decode = l <= DECODE_L
    aim, step = (SPLIT_KEYS, DECODE_CHUNK) if decode else (PREFILL_SPLIT_KEYS, bc)
    n = min(MAX_SPLITS, groups(keys, aim)) if step else 1
    if not decode:
        n = min(n, groups(PREFILL_MIN_GRID, max(grid, 1)))
    if held is not None:
        n = min(n, held // record_bytes(rows, ev, 1))
    if n <= 1:
        return 1, max(keys, 1)
    per = groups(groups(keys, n), step) * step
    return groups(keys, per), per


def split_bytes(l: int, keys: int, rows: int, ev: int, bc: int, grid: int = 0) -> int:
    """Bytes of the partials that key_splits gives live L (0 when it does not split)."""
    splits, _ = key_splits(l, keys, rows, ev, bc, grid=grid)
    return record_bytes(rows, ev, splits) if splits > 1 else 0


def record_bytes(rows: int, ev: int, splits: int) -> int:
    """Bytes of `splits` (m, l, acc) partials for each of `rows` rows."""
    return max(rows, 1) * splits * (ev + PARTIAL_FIELDS) * 4


def read_strides(ins, attrs) -> list:
    """Element strides of q's (b, h, l, e), k's and v's (b, h, s, e) in inputs 0, 1 and 2
    (q = input.permute(q_dims), ...), flattened in that order."""
    strides = []
    for stored, key in zip(ins, SDPA_READ_DIMS):
        own = contiguous_strides(stored)
        strides += [own[i] for i in attrs.get(key) or range(len(stored))]
    return strides


def out_strides(stored, attrs) -> list:
    """Element strides of the output's (b, h, l, e) where it is stored as
    out.permute(out_dims)."""
    own, strides = contiguous_strides(stored), [0] * len(stored)
    for d, i in enumerate(attrs.get("out_dims") or range(len(stored))):
        strides[i] = own[d]
    return strides


def partials_bytes(ins, split: bool, bc: int, br: int) -> int:
    """Scratch for the partials at the upper-bound shapes, q, k and v as read (0 when not
    split): the larger of decode's (L up to DECODE_L) and the most any prefill L up to the
    bound takes (prefill_bytes), at most PREFILL_PARTIALS_BYTES (a live prefill takes the
    splits that fit: key_splits' `held`)."""
    if not split:
        return 0
    (b, hq, l, _), (_, hkv, s, ev) = ins[0], ins[2]
    decode = split_bytes(min(l, DECODE_L), s, b * hq * min(l, DECODE_L), ev, bc)
    if l <= DECODE_L or not bc:
        return decode
    return max(decode, min(prefill_bytes(b, hq, hkv, l, s, ev, bc, br), PREFILL_PARTIALS_BYTES))


def prefill_bytes(b: int, hq: int, hkv: int, l_bound: int, s: int, ev: int, bc: int,
                  br: int) -> int:
    """The most partials a prefill of L in (DECODE_L, l_bound] writes over s keys: for each
    count of row tiles, at the longest L with that many (the most rows), until the unsplit
    grid reaches PREFILL_MIN_GRID and no L splits."""
    n_rep, most = max(hq // max(hkv, 1), 1), 0
    for tiles in range(1, groups(n_rep * l_bound, br) + 1):
        l = min(l_bound, tiles * br // n_rep)
        grid = b * hkv * groups(n_rep * l, br)
        if grid >= PREFILL_MIN_GRID:
            break
        if l > DECODE_L:
            most = max(most, split_bytes(l, s, b * hq * l, ev, bc, grid))
    return most


@register_wgsl("sdpa")
def sdpa(ins, outs, attrs, info):
    (q, k, v), mask = sdpa_read_shapes(ins, attrs), ins[3] if len(ins) > 3 else None
    if q[3] > MAX_HEAD or v[3] > MAX_HEAD:
        raise UnsupportedError(f"sdpa head dims on WebGPU: expected at most {MAX_HEAD}, "
                               f"got E={q[3]}, Ev={v[3]}")
    storage = info.gpu.limits.get("max-compute-workgroup-storage-size", DEFAULT_WG_STORAGE)
    tile = flash_tile(q[3], v[3], storage)
    dtile = DecodeTile(groups(q[3], 4), groups(v[3], 4))
    ptile = prefill_tile(q[3], v[3], storage)
    pbc = ptile.bc if ptile else 0   # `flash` takes one split
    pbr = ptile.br if ptile else tile.br
    scratch = partials_bytes([q, k, v, *ins[3:]], info.scratch, pbc, pbr)
    split = scratch > 0
    mask_kind = 0 if mask is None else (1 if info.in_dtypes[3] == torch.bool else 2)

    def params(ins, outs, attrs):
        """(params, workgroups, splits) of the kernel the live L picks."""
        (b, hq, l, e), _, (_, hkv, s, ev) = sdpa_read_shapes(ins, attrs)
        scale = attrs.get("scale")
        scale = 1.0 / math.sqrt(e) if scale is None else float(scale)
        mstrides = broadcast_strides(ins[3], (b, hq, l, s)) if mask is not None else [0] * 4
        n_rep = hq // hkv if hkv else 0
        keys = s if attrs.get("kv_len") is None else min(s, attrs["kv_len"])
        tiles = groups(n_rep * l, dtile.rb if l <= DECODE_L else pbr)
        split_over = s if l <= DECODE_L else keys   # decode: a grid fixed at every position
        splits, per = key_splits(l, split_over, b * hq * l, ev, pbc, scratch, b * hkv * tiles)
        packed = words(b, hq, hkv, l, s, e, ev, n_rep, scale, tiles, splits, per,
                       keys, attrs.get("causal_offset", 0), 0, 0, mstrides,
                       read_strides(ins, attrs), out_strides(outs[0], attrs))
        return packed, b * hkv * tiles * splits if ev else 0, splits

    def sizes_when(decode: bool):
        def sizes(ins, outs, attrs):
            packed, count, _ = params(ins, outs, attrs)
            return packed, count if decode_l(ins, attrs) == decode else 0
        return sizes

    def combine_sizes(ins, outs, attrs):
        packed, _, splits = params(ins, outs, attrs)
        (b, hq, l, _), ev = sdpa_read_shapes(ins, attrs)[0], ins[2][3]
        return packed, b * hq * l if splits > 1 and ev else 0

    m_arg = 3 if mask is not None else None
    # the partials' scratch operand; one pass never writes it, so the output stands in
    scr = len(ins) + len(outs) if split else 4
    consts = (("MASK", mask_kind), ("CAUSAL", int(bool(attrs.get("is_causal")))))
    # every entry's constants: the module declares all three kernels' workgroup arrays (those
    # an entry does not use cost it nothing); a prefill tile that does not fit is never run
    placeholder = PrefillTile(*UNUSED_TILE, dtile.de4, dtile.dv4)
    extra = {"prelude": "\n".join((tile.prelude(), dtile.prelude(),
                                   (ptile or placeholder).prelude(), loaders(q[3], v[3]))),
             "scratch": (scratch,) if split else ()}
    args, writes = (0, 1, 2, m_arg, 4, scr), (4, scr)
    extra["fixed_grid"] = decoding   # prefill's splits follow the live keys
    kernels = [Dispatch("attention", "decode", args, writes, sizes_when(True), consts,
                        label="sdpa_decode", **extra)]
    if q[2] > DECODE_L:   # the L bound admits prefill
        entry = "prefill" if ptile else "flash"
        kernels.append(Dispatch("attention", entry, args, writes, sizes_when(False), consts,
                                label=f"sdpa_{entry}", shared_params=True, **extra))
    if split:
        kernels.append(Dispatch("attention", "combine", (None, None, None, None, 4, scr), writes,
                                combine_sizes, consts, label="sdpa_combine", shared_params=True,
                                **extra))
    return kernels


def decode_l(ins, attrs) -> bool:
    """Whether the live L picks the decode kernel (L <= DECODE_L)."""
    return sdpa_read_shapes(ins, attrs)[0][2] <= DECODE_L


def decoding(ins, attrs) -> bool:
    """sdpa's Dispatch.fixed_grid: at a binding of decode L every sdpa grid is the same at
    every kv_len (decode splits the cache's whole range, prefill does not run, combine follows
    decode's splits); at prefill L the splits follow the live keys."""
    return decode_l(ins, attrs)

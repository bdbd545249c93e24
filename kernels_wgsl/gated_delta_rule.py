"""Gated delta rule on WebGPU (gated_delta_rule.wgsl): recurrent decode and chunked prefill.

Live T <= DECODE_MAX_T runs `recurrent`: one workgroup per (batch, state head, 8 value
columns), the state slice in registers, a workgroup reduction per token. Longer T runs the
chunked WY route, FLA's chunk_fwd in WGSL: `recurrent` with no tokens copies initial_state into
final_state (the carry), then per segment of chunks
    chunk_prep  (batch, state head, chunk)          the state-independent terms -> records
    chunk_scan  (batch, state head, BV columns)     serial over the segment's chunks: state
                                                    snapshots and δ; S in workgroup memory,
                                                    in final_state between segments
    chunk_out   (batch, query head, chunk, 128 cols) the outputs, parallel over chunks
Only chunk_scan is serial, and it is split over value columns (column v of S and of δ needs only
column v of S and of U): B*Hs*V/16 workgroups, 128 at Hs=16, V=128. Segments bound the scratch:
at most SCRATCH_BUDGET bytes (and the binding limit) of records at a time. Without executor
scratch every T runs `recurrent`, token by token.

K, V and the heads are fixed per load and go into each dispatch's prelude as constants (loops
of known trip count); each prelude also sizes only its own entry point's workgroup arrays (the
others get one element), so no module declares more workgroup memory than its dispatch needs.
"""
from __future__ import annotations

from dataclasses import dataclass

from delegate.errors import UnsupportedError
from kernels_wgsl import Dispatch, groups, register_wgsl, words

CHUNK = 32               # tokens per chunk: random (0,1) decays keep |log Γ| < SAFE within it
SAFE = 80.0              # log Γ >= -SAFE keeps 1/Γ a finite float32 (e^80 < 3.4e38 / 1e3)
THREADS = 256            # every entry point's workgroup size
K_TILE = 16              # key channels per staged tile in chunk_prep
MAX_DIM = 256            # K and V
DECODE_MAX_T = 1         # live T up to this runs the token recurrence
SCRATCH_BUDGET = 1 << 28  # bytes of chunk records per segment: T=2048 at Hs=16, K=V=128 is one
HEAD_ROUND = 2           # query heads reduced per round of the token step
DECODE_COLUMNS = 8       # value columns per recurrent workgroup (32 lanes over K)
# chunk_scan value columns per workgroup, widest first: the first whose tiles fit the device's
# workgroup memory. 16 makes B*Hs*V/16 workgroups: 128 at Hs=16, V=128 on a 132-SM GPU.
SCAN_COLUMNS = (16, 8, 4)
SCAN_ROWS = (32, 16, 8, 4, 2, 1)  # chunk rows staged at a time, most first
OUT_COLUMNS = 128        # chunk_out value columns per workgroup (32 threads of vec4)
OUT_ROWS = 16            # chunk_out inner rows per staged tile (10 KiB of tiles)
WORKGROUP_BYTES = 16384  # WebGPU's guaranteed workgroup storage, when the device reports none

# the WGSL hard-codes these: 4 (t, i) entries of a 32 x 32 chunk matrix per thread, a 32-row
# column of right-hand sides in 8 vec4s, 2 entries of a prep tile per thread, chunk_out's rows
# 4ty.. and columns 4tx.. (8 x 32 threads)
assert CHUNK == 32 and THREADS == 256 and CHUNK * K_TILE == 2 * THREADS and OUT_COLUMNS == 128


@dataclass(frozen=True)
class Heads:
    """What the kernels take as constants: K, V, query heads per state head, decay channels."""
    k: int
    v: int
    g: int
    kd: int

    @property
    def kp(self) -> int:
        return groups(self.k, 4) * 4

    @property
    def vp(self) -> int:
        return groups(self.v, 4) * 4


@dataclass(frozen=True)
class ScanTile:
    bv: int   # value columns per workgroup
    tc: int   # chunk rows staged at a time

    @property
    def ksplit(self) -> int:
        """Threads summing one δ entry: each takes every ksplit-th key channel."""
        return THREADS // (self.tc * self.bv // 4)


def _dims(ins) -> tuple:
    (b, hq, t, k), hs, v = ins[0], ins[1][1], ins[2][3]
    return b, hq, hs, t, k, v, (k if len(ins[3]) == 4 else 1)


def heads_of(ins) -> Heads:
    _, hq, hs, _, k, v, kd = _dims(ins)
    return Heads(k, v, hq // hs, kd)


def record_fields(h: Heads) -> tuple:
    """(name, floats) of one chunk's record, in order (see the WGSL's chunk records)."""
    c = CHUNK
    return (("FLAG", 4), ("GL", h.kp), ("GAM", c * h.kp), ("KEND", c * h.kp), ("W", c * h.kp),
            ("U", c * h.vp), ("QG", h.g * c * h.kp), ("PM", h.g * c * c), ("H", h.kp * h.vp))


def record_floats(h: Heads) -> int:
    return sum(n for _, n in record_fields(h))


def token_floats(g: int) -> int:
    """wsh floats of the token step's two halves of reductions."""
    return 2 * (1 + 2 * min(g, HEAD_ROUND)) * THREADS


def scan_arrays(h: Heads, tile: ScanTile) -> dict:
    """chunk_scan's workgroup arrays: s_cur and delta_s in vec4s, wsh in floats."""
    rows = 2 * tile.tc * (h.kp + 1) + 4 * THREADS   # W and K⊙Γ_L/Γ rows, δ partials
    return {"SCAN_S": h.kp * tile.bv // 4, "SCAN_D": tile.tc * tile.bv // 4,
            "WSH": max(rows, token_floats(h.g))}


def scan_bytes(h: Heads, tile: ScanTile) -> int:
    a = scan_arrays(h, tile)
    return 16 * (a["SCAN_S"] + a["SCAN_D"]) + 4 * a["WSH"]


def scan_tile(h: Heads, limit: int) -> ScanTile:
    """The widest column block, then the most staged rows, whose arrays fit `limit` bytes."""
    for bv in SCAN_COLUMNS:
        for tc in SCAN_ROWS:
            tile = ScanTile(bv, tc)
            # a stage is at most 4 groups of 4 floats per thread (the WGSL's Stage)
            fits = tc * bv // 4 <= THREADS and tc * h.kp <= 16 * THREADS
            if fits and scan_bytes(h, tile) <= limit:
                return tile
    raise UnsupportedError(f"gated_delta_rule chunk_scan workgroup memory: expected K={h.k} "
                           f"to fit {limit} bytes, got {scan_bytes(h, ScanTile(4, 1))} at least")


def _prelude(h: Heads, tile: ScanTile, lanes: tuple, arrays: dict) -> str:
    kl, vb = lanes
    offsets, at = [], 0
    for name, n in record_fields(h):
        offsets.append((f"R_{name}", at))
        at += n
    sizes = {"WSH": 1, "SCAN_S": 1, "SCAN_D": 1, "PREP_TILE": 1, "PREP_CC": 1, "PREP_CC4": 1,
             "OUT_A": 1, "OUT_B": 1, **arrays}
    consts = [("DK", h.k), ("DV", h.v), ("KP", h.kp), ("VP", h.vp), ("G", h.g), ("KD", h.kd),
              ("C", CHUNK), ("KT", K_TILE), ("REC", at), *offsets,
              ("KL", kl), ("VB", vb), ("NK", groups(h.k, kl)), ("GB", min(h.g, HEAD_ROUND)),
              ("BV", tile.bv), ("NVQ", tile.bv // 4), ("TC", tile.tc), ("KSPLIT", tile.ksplit),
              ("NS", groups(h.kp * tile.bv // 4, THREADS)), ("OV", OUT_COLUMNS), ("BR", OUT_ROWS),
              *sizes.items()]
    return "\n".join([f"const {n}: u32 = {x}u;" for n, x in consts] +
                     [f"const SAFE: f32 = {SAFE};"])


def _segment_cap(ins, limit: int) -> int:
    """Chunks per segment: as many as fit the scratch budget (at least one)."""
    b, _, hs, t = _dims(ins)[:4]
    per_chunk = b * hs * record_floats(heads_of(ins)) * 4
    return max(1, min(groups(t, CHUNK), min(limit, SCRATCH_BUDGET) // max(1, per_chunk)))


def _check(ins) -> None:
    _, hq, hs, _, k, v, _ = _dims(ins)
    if k > MAX_DIM or v > MAX_DIM:
        raise UnsupportedError(f"gated_delta_rule head dims on WebGPU: expected K, V <= "
                               f"{MAX_DIM}, got K={k}, V={v}")
    if hs == 0 or hq % hs:
        raise UnsupportedError(f"gated_delta_rule heads: expected Hq a multiple of Hs, "
                               f"got Hq={hq}, Hs={hs}")


def _same_heads(built: Heads, live) -> None:
    if heads_of(live) != built:
        raise UnsupportedError(f"gated_delta_rule live heads: expected the loaded {built}, "
                               f"got {heads_of(live)}")


@dataclass(frozen=True)
class _Route:
    """How one load's dispatches size themselves from the live shapes."""
    heads: Heads
    tile: ScanTile
    cap: int          # chunks per segment
    chunked: bool     # the executor binds scratch and the build T can take the chunked route

    def params(self, live, vblocks=0, tokens=0, seg_first=0, seg_chunks=0, oblocks=0) -> bytes:
        _same_heads(self.heads, live)
        b, hq, hs, t = _dims(live)[:4]
        return words(b, hq, hs, t, vblocks, tokens, seg_first, self.cap, seg_chunks, oblocks,
                     0, 0)

    def takes_chunks(self, live) -> bool:
        return self.chunked and live[0][2] > DECODE_MAX_T

    def recurrent_sizes(self, live, outs, attrs):
        b, _, hs, t = _dims(live)[:4]
        vb = groups(self.heads.v, DECODE_COLUMNS)
        tokens = 0 if self.takes_chunks(live) else t
        return self.params(live, vb, tokens), b * hs * vb if self.heads.k else 0

    def live_chunks(self, live, j: int) -> int:
        n = groups(live[0][2], CHUNK)
        return max(0, min(self.cap, n - j * self.cap)) if self.takes_chunks(live) else 0

    def prep_sizes(self, j: int, live, outs, attrs):
        m = self.live_chunks(live, j)
        b, _, hs = _dims(live)[:3]
        return self.params(live, 0, 0, j * self.cap, m), b * hs * m

    def scan_sizes(self, j: int, live, outs, attrs):
        m = self.live_chunks(live, j)
        b, _, hs = _dims(live)[:3]
        vb = groups(self.heads.v, self.tile.bv)
        return self.params(live, vb, 0, j * self.cap, m), b * hs * vb if m else 0

    def out_sizes(self, j: int, live, outs, attrs):
        m = self.live_chunks(live, j)
        b, hq = _dims(live)[:2]
        ob = groups(self.heads.v, OUT_COLUMNS)
        return self.params(live, 0, 0, j * self.cap, m, ob), b * hq * m * ob


def _preludes(h: Heads, tile: ScanTile) -> dict:
    """entry point -> prelude: its token lanes and its own workgroup arrays."""
    decode = (THREADS // DECODE_COLUMNS, DECODE_COLUMNS)
    cc = CHUNK * CHUNK
    return {
        "recurrent": _prelude(h, tile, decode, {"WSH": token_floats(h.g)}),
        "chunk_prep": _prelude(h, tile, decode, {"PREP_TILE": CHUNK * (K_TILE + 1),
                                                 "PREP_CC": cc, "PREP_CC4": cc // 4}),
        "chunk_scan": _prelude(h, tile, (THREADS // tile.bv, tile.bv), scan_arrays(h, tile)),
        "chunk_out": _prelude(h, tile, decode, {"OUT_A": OUT_ROWS * CHUNK // 4,
                                                "OUT_B": OUT_ROWS * OUT_COLUMNS // 4}),
    }


@register_wgsl("gated_delta_rule")
def gated_delta_rule(ins, outs, attrs, info):
    _check(ins)
    h = heads_of(ins)
    limits = info.gpu.limits
    tile = scan_tile(h, limits.get("max-compute-workgroup-storage-size", WORKGROUP_BYTES))
    chunked = bool(info.scratch) and ins[0][2] > DECODE_MAX_T
    cap = _segment_cap(ins, limits["max-storage-buffer-binding-size"]) if chunked else 1
    route = _Route(h, tile, cap, chunked)
    pre = _preludes(h, tile)
    first = Dispatch("gated_delta_rule", "recurrent", (0, 1, 2, 3, 4, 5, 6, 7), (6, 7),
                     route.recurrent_sizes, label="gdr_recurrent", prelude=pre["recurrent"])
    if not chunked:
        return [first]
    scr = len(ins) + len(outs)
    b, _, hs = _dims(ins)[:3]
    scratch = (b * hs * cap * record_floats(h) * 4,)

    def segment(j: int) -> list:
        def sized(fn):
            return lambda live, o, a: fn(j, live, o, a)

        prep = Dispatch("gated_delta_rule", "chunk_prep", (0, 1, 2, 3, 4, scr), (scr,),
                        sized(route.prep_sizes), label="gdr_chunk_prep",
                        prelude=pre["chunk_prep"], scratch=scratch)
        scan = Dispatch("gated_delta_rule", "chunk_scan", (0, 1, 2, 3, 4, scr, 6, 7),
                        (scr, 6, 7), sized(route.scan_sizes), label="gdr_chunk_scan",
                        prelude=pre["chunk_scan"], scratch=scratch)
        # bindings 1..5 are unused by chunk_out; binding 6 reads the records, 7 is out
        out = Dispatch("gated_delta_rule", "chunk_out", (0, 1, 2, 3, 4, scr, 6), (6,),
                       sized(route.out_sizes), label="gdr_chunk_out",
                       prelude=pre["chunk_out"], scratch=scratch)
        return [prep, scan, out]

    segments = groups(groups(ins[0][2], CHUNK), cap)
    return [first] + [d for j in range(segments) for d in segment(j)]

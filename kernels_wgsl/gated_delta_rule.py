"""Gated delta rule on WebGPU (gated_delta_rule.wgsl): recurrent decode and chunked prefill.

Live T <= DECODE_MAX_T runs `recurrent`: one workgroup per (batch, state head, VB value
columns), the state slice in registers, a workgroup reduction per token. Longer T runs the
chunked WY route: `recurrent` with no tokens copies initial_state into final_state (the carry),
then per segment of chunks `chunk_prep` (parallel over chunks) writes each chunk's
state-independent terms to a scratch record and `chunk_scan` walks the segment's chunks in
order, carrying the state in final_state. Segments bound the scratch: at most SCRATCH_BUDGET
bytes (and the binding limit) of records at a time. Without executor scratch every T runs
`recurrent`, token by token.
"""
from __future__ import annotations

from delegate.errors import UnsupportedError
from kernels_wgsl import Dispatch, groups, register_wgsl, words

CHUNK = 32               # tokens per chunk: random (0,1) decays keep |log Γ| < SAFE within it
SAFE = 80.0              # log Γ >= -SAFE keeps 1/Γ a finite float32 (e^80 < 3.4e38 / 1e3)
THREADS = 256            # every entry point's workgroup size
K_TILE = 16              # key channels per staged tile in chunk_prep
MAX_DIM = 256            # K and V
DECODE_MAX_T = 1         # live T up to this runs the token recurrence
SCRATCH_BUDGET = 1 << 27  # bytes of chunk records per segment
HEAD_ROUND = 2           # query heads reduced per round of the token step


def lanes(k: int) -> tuple:
    """(KL lanes over K, VB value columns) of a state-carrying workgroup: KL * VB = THREADS,
    at most 8 state rows per thread (K <= 256). 8 columns per workgroup make B*Hs*V/8
    workgroups: 256 at H=16, V=128, two per SM of a 132-SM GPU to hide the scan's latency."""
    return 32, THREADS // 32


def record_floats(k: int, v: int, g: int) -> int:
    """One chunk's record: flag (padded to 4), Γ, K⊙Γ_L/Γ, Γ⊙Q, W, U, P."""
    return 4 + CHUNK * (3 * k + g * k + v + g * CHUNK)


def _prelude(k: int, g: int) -> str:
    kl, vb = lanes(k)
    gb = min(g, HEAD_ROUND)
    wsh = max(k * vb + CHUNK * vb, 2 * (1 + 2 * gb) * THREADS)
    consts = (("KL", kl), ("VB", vb), ("NK", groups(k, kl)), ("GB", gb), ("C", CHUNK),
              ("KT", K_TILE), ("WSH", wsh))
    return "\n".join([f"const {n}: u32 = {x}u;" for n, x in consts] +
                     [f"const SAFE: f32 = {SAFE};"])


def _dims(ins) -> tuple:
    (b, hq, t, k), hs, v = ins[0], ins[1][1], ins[2][3]
    return b, hq, hs, t, k, v, (k if len(ins[3]) == 4 else 1)


def _segment_cap(ins, limit: int) -> int:
    """Chunks per segment: as many as fit the scratch budget (at least one)."""
    b, hq, hs, t, k, v, _ = _dims(ins)
    per_chunk = b * hs * record_floats(k, v, hq // hs) * 4
    return max(1, min(groups(t, CHUNK), min(limit, SCRATCH_BUDGET) // max(1, per_chunk)))


def _check(ins) -> None:
    _, hq, hs, _, k, v, _ = _dims(ins)
    if k > MAX_DIM or v > MAX_DIM:
        raise UnsupportedError(f"gated_delta_rule head dims on WebGPU: expected K, V <= "
                               f"{MAX_DIM}, got K={k}, V={v}")
    if hs == 0 or hq % hs:
        raise UnsupportedError(f"gated_delta_rule heads: expected Hq a multiple of Hs, "
                               f"got Hq={hq}, Hs={hs}")


@register_wgsl("gated_delta_rule")
def gated_delta_rule(ins, outs, attrs, info):
    _check(ins)
    k, g = ins[0][3], ins[0][1] // ins[1][1]
    chunked = info.scratch and ins[0][2] > DECODE_MAX_T
    cap = _segment_cap(ins, info.gpu.limits["max-storage-buffer-binding-size"]) if chunked else 1
    vb = lanes(k)[1]
    rec = record_floats(k, ins[2][3], g)

    def params(live, tokens=0, seg_first=0, seg_chunks=0):
        b, hq, hs, t, kk, v, kd = _dims(live)
        return words(b, hq, hs, t, kk, v, hq // hs, kd, groups(v, vb), tokens, seg_first, cap,
                     seg_chunks, rec, 0, 0)

    def takes_chunks(live) -> bool:
        return chunked and live[0][2] > DECODE_MAX_T

    def state_workgroups(live) -> int:
        b, _, hs, _, kk, v, _ = _dims(live)
        return b * hs * groups(v, vb) if kk else 0

    def recurrent_sizes(live, outs, attrs):
        t = live[0][2]
        return params(live, 0 if takes_chunks(live) else t), state_workgroups(live)

    def segment(j: int):
        def live_chunks(live) -> int:
            n = groups(live[0][2], CHUNK)
            return max(0, min(cap, n - j * cap)) if takes_chunks(live) else 0

        def prep_sizes(live, outs, attrs):
            m = live_chunks(live)
            b, _, hs = _dims(live)[:3]
            return params(live, 0, j * cap, m), b * hs * m

        def scan_sizes(live, outs, attrs):
            m = live_chunks(live)
            return params(live, 0, j * cap, m), state_workgroups(live) if m else 0

        scr = len(ins) + len(outs)
        prep = Dispatch("gated_delta_rule", "chunk_prep", (0, 1, 2, 3, 4, scr), (scr,),
                        prep_sizes, label="gdr_chunk_prep", prelude=prelude, scratch=scratch)
        scan = Dispatch("gated_delta_rule", "chunk_scan", (0, 1, 2, 3, 4, scr, 6, 7),
                        (scr, 6, 7), scan_sizes, label="gdr_chunk_scan", prelude=prelude,
                        scratch=scratch)
        return [prep, scan]

    prelude = _prelude(k, g)
    b, _, hs = _dims(ins)[:3]
    scratch = (b * hs * cap * rec * 4,) if chunked else ()
    first = Dispatch("gated_delta_rule", "recurrent", (0, 1, 2, 3, 4, 5, 6, 7), (6, 7),
                     recurrent_sizes, label="gdr_recurrent", prelude=prelude)
    if not chunked:
        return [first]
    segments = groups(groups(ins[0][2], CHUNK), cap)
    return [first] + [d for j in range(segments) for d in segment(j)]

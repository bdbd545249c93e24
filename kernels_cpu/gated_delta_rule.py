"""Gated delta rule on CPU: recurrent decode (T == 1) and chunked WY prefill (T != 1).

Per state head, with decay d_t already exponentiated (per key channel, or one scalar):

    S_t = diag(d_t) S_{t-1} + k_t δ_t^T,    δ_t = β_t (v_t - k_t^T diag(d_t) S_{t-1})
    o_t = S_t^T q_t                         (query heads s*G .. s*G+G-1 read state s)

recurrent_decode: pass 1 only reads S: δ = β (v - (d⊙k)^T S). Pass 2 writes
S' = diag(d) S + k δ^T and reads out o = S'^T q. All (batch, head) pairs in one batched call each.

chunked_prefill, chunks of C tokens, Γ_t = Π_{j<=t} d_j inside the chunk (a cumprod):
    A_ti = Σ_c k_tc k_ic Γ_tc/Γ_ic  (i < t)          P_ti = Σ_c q_tc k_ic Γ_tc/Γ_ic  (i <= t)
    (I + diag(β) A) [W | U] = diag(β) [Γ⊙K | V]      WY pseudo-keys W, pseudo-values U
    δ = U - W S0,   O = (Γ⊙Q) S0 + P δ,   S_C = diag(Γ_C) S0 + (K ⊙ Γ_C/Γ)^T δ
Everything but the carry (δ, S_C) is state independent and runs batched over a block of chunks
and all of a worker's heads. Γ_t/Γ_i is formed as Γ_t * (1/Γ_i) only where Γ stays inside
[e^-80, e^80], so that product can never overflow; any other (head, chunk) — a decay <= 0, or
decays near 1e-12 that underflow Γ — forms Γ_t/Γ_i = Π_{j=i+1..t} d_j directly (exact path).
A ragged last chunk is padded with k = q = v = β = 0, d = 1, which leaves the state unchanged.
"""
from __future__ import annotations

import math
import threading

import torch

from kernels_cpu import register_kernel
from kernels_cpu.threadpool import (
    ScratchArena, get_pool, single_threaded_torch, typed, worker_slices,
)

CHUNK = 32            # tokens per chunk: random (0,1) decays keep |log Γ| < 80 within 32 tokens
BLOCK_ROWS = 2048     # chunk rows (heads x chunks x C) per batched block; bounds scratch size
_SAFE = 80.0          # |log Γ| bound under which Γ_t * (1/Γ_i) stays a normal float32
_EXACT_GROUP = 4      # (head, chunk) pairs per exact-path batch: C*C*K floats each


# ---- sizes -------------------------------------------------------------------------------------
def _dims(shapes):
    (B, Hq, T, K), Hs, V = shapes[0], shapes[1][1], shapes[2][3]
    return B, Hq, Hs, T, K, V, (K if len(shapes[3]) == 4 else 1)


def _plan(T: int, rows: int):
    """(chunk size, number of chunks, chunks per block) for `rows` state heads on one worker."""
    C = min(CHUNK, T)
    N = -(-T // C)
    return C, N, max(1, min(N, BLOCK_ROWS // max(1, rows * C)))


def _layout(nh, nb, C, K, V, G, Kd):
    """Named float32 buffers of one worker's scratch slice, in carve order."""
    E = nb * nh
    return (
        ("carry", (nh, K, V)), ("states", (nb, nh, K, V)),
        ("d", (E, C, Kd)), ("g", (E, C, Kd)), ("ginv", (E, C, Kd)), ("beta", (E, C, 1)),
        ("k", (E, C, K)), ("kg", (E, C, K)), ("kinv", (E, C, K)), ("kend", (E, C, K)),
        ("q", (E, G * C, K)), ("qg", (E, G * C, K)), ("v", (E, C, V)), ("A", (E, C, C)), ("P", (E, G * C, C)),
        ("rhs", (E, C, K + V)), ("wu", (E, C, K + V)), ("delta", (E, C, V)),
        ("o", (E, G * C, V)),
    )


def _nbytes(layout) -> int:
    return sum(4 * math.prod(shape) + 64 for _, shape in layout)


def _per_worker(T, rows, K, V, G, Kd) -> int:
    if T <= 1:
        return 0
    C, _, nb = _plan(T, rows)
    return _nbytes(_layout(rows, nb, C, K, V, G, Kd))


def scratch_nbytes(in_shapes, attrs, num_workers: int) -> int:
    B, Hq, Hs, T, K, V, Kd = _dims(in_shapes)
    R = B * Hs
    w = 1 if T <= 1 else max(1, min(num_workers, R))
    return w * ((_per_worker(T, -(-R // w), K, V, Hq // Hs, Kd) + 63) // 64 * 64)


def _carve(buf: torch.Tensor, layout) -> dict:
    views, off = {}, 0
    for name, shape in layout:
        n = 4 * math.prod(shape)
        views[name] = typed(buf[off:], torch.float32, shape)
        off += (n + 63) // 64 * 64
    return views


# ---- T == 1: recurrent decode --------------------------------------------------------------------
def _recurrent_decode(q, k, v, d, beta, s0, out, final) -> None:
    """q [R,G,K], k [R,K], v [R,V], d [R,Kd], beta [R], s0/final [R,K,V], out [R,G,V]."""
    pred = torch.bmm((k * d).unsqueeze(1), s0)                 # pass 1: reads S only
    delta = torch.sub(v.unsqueeze(1), pred, out=pred).mul_(beta.view(-1, 1, 1))
    torch.mul(s0, d.unsqueeze(-1), out=final)                  # pass 2: decay,
    final.baddbmm_(k.unsqueeze(-1), delta)                     # rank-1 update,
    torch.bmm(q, final, out=out)                               # read out


# ---- T != 1: chunked prefill ---------------------------------------------------------------------
def _load(dst: torch.Tensor, src: torch.Tensor, C: int, pad: float) -> None:
    """src [nh, *X, L, F] (tokens of a block) -> dst [nb, nh, *X, C, F], padding the tail."""
    nb, L = dst.shape[0], src.shape[-2]
    full, rem = divmod(L, C)
    dst = dst.movedim(0, -3)                                   # [nh, *X, nb, C, F] view
    if full:
        dst[..., :full, :, :].copy_(src[..., :full * C, :].unflatten(-2, (full, C)))
    if rem:
        dst[..., full, :rem, :].copy_(src[..., full * C:, :])
    if full * C + rem < nb * C:
        dst[..., full, rem:, :].fill_(pad)
        dst[..., full + 1:, :, :].fill_(pad)


def _store(dst: torch.Tensor, src: torch.Tensor, C: int) -> None:
    """Inverse of _load for the output: src [nb, nh, G, C, V] -> dst [nh, G, L, V]."""
    L = dst.shape[-2]
    full, rem = divmod(L, C)
    src = src.movedim(0, -3)                                   # [nh, G, nb, C, V]
    if full:
        dst[..., :full * C, :].unflatten(-2, (full, C)).copy_(src[..., :full, :, :])
    if rem:
        dst[..., full * C:, :].copy_(src[..., full, :rem, :])


def _decay_terms(b: dict, E: int, C: int):
    """Γ, 1/Γ and the flags of (head, chunk) rows whose Γ leaves the safe range."""
    torch.cumprod(b["d"], dim=1, out=b["g"])
    torch.reciprocal(b["g"], out=b["ginv"])
    lo, hi = torch.aminmax(b["g"].view(E, -1), dim=1)
    # not (lo >= e^-80) also catches NaN; lo <= 0 covers decays <= 0
    bad = ~(lo >= math.exp(-_SAFE)) | (hi > math.exp(_SAFE))
    return bad.nonzero().flatten().tolist() if bool(bad.any()) else []


def _exact_rows(b: dict, rows: list, C: int, G: int) -> None:
    """Overwrite A, P and the end-of-chunk keys of flagged rows with Γ_t/Γ_i = Π_{i<j<=t} d_j,
    built by a cumprod over a [C, C] table, so no factor is ever inverted."""
    upto_i = torch.ones(C, C, dtype=torch.bool).tril_()        # [i, t]: t <= i, empty product
    for i in range(0, len(rows), _EXACT_GROUP):
        r = torch.tensor(rows[i:i + _EXACT_GROUP])
        d, k, q = b["d"][r], b["k"][r], b["q"][r].unflatten(1, (G, C))
        table = d.unsqueeze(1).expand(-1, C, -1, -1).masked_fill(upto_i[..., None], 1.0)
        z = table.cumprod(dim=2) * k.unsqueeze(2)              # z[i, t, c] = F[i,t,c] k_ic
        b["A"][r] = torch.einsum("xitc,xtc->xti", z, k)
        b["P"][r] = torch.einsum("xitc,xgtc->xgti", z, q).flatten(1, 2)
        b["kend"][r] = z[:, :, C - 1, :]


def _intra_chunk(b: dict, E: int, C: int, G: int, K: int) -> None:
    """The state-independent work of a block: Γ terms, A, P, the UT solve for W and U."""
    rows = _decay_terms(b, E, C)
    g, ginv, k = b["g"], b["ginv"], b["k"]
    torch.mul(k, g, out=b["kg"])
    torch.mul(k, ginv, out=b["kinv"])
    torch.mul(k, ginv.mul_(g[:, C - 1:C]), out=b["kend"])      # k_i Γ_C/Γ_i
    torch.mul(b["q"].view(E, G, C, K), g.unsqueeze(1), out=b["qg"].view(E, G, C, K))
    torch.bmm(b["kg"], b["kinv"].transpose(1, 2), out=b["A"])
    torch.bmm(b["qg"], b["kinv"].transpose(1, 2), out=b["P"])
    if rows:
        _exact_rows(b, rows, C, G)
    b["P"].view(E, G, C, C).tril_()
    # the solve reads only the strict lower triangle of A (unit diagonal implied)
    b["A"].mul_(b["beta"])
    rhs = b["rhs"]
    torch.mul(b["kg"], b["beta"], out=rhs[..., :K])
    torch.mul(b["v"], b["beta"], out=rhs[..., K:])
    torch.linalg.solve_triangular(b["A"], rhs, upper=False, unitriangular=True, out=b["wu"])


def _carry(b: dict, nb: int, nh: int, C: int, K: int) -> None:
    """The sequential part: per chunk, δ = U - W S and S' = diag(Γ_C) S + K_end^T δ."""
    wu = b["wu"].view(nb, nh, C, -1)
    w, u = wu[..., :K], wu[..., K:]
    g_end = b["g"].view(nb, nh, C, -1)[:, :, C - 1, :].unsqueeze(-1)
    kend_t = b["kend"].view(nb, nh, C, K).transpose(2, 3)
    delta, states = b["delta"].view(nb, nh, C, -1), b["states"]
    states[0].copy_(b["carry"])
    for n in range(nb):
        nxt = states[n + 1] if n + 1 < nb else b["carry"]
        torch.baddbmm(u[n], w[n], states[n], alpha=-1.0, out=delta[n])
        torch.mul(states[n], g_end[n], out=nxt)
        nxt.baddbmm_(kend_t[n], delta[n])


def _chunked_prefill(q, k, v, d, beta, s0, out, final, scratch) -> None:
    """One worker: q [nh,G,T,K], k [nh,T,K], v [nh,T,V], d [nh,T,Kd], beta [nh,T,1],
    s0/final [nh,K,V], out [nh,G,T,V]."""
    nh, G, T, K = q.shape
    V, Kd = v.shape[-1], d.shape[-1]
    C, N, nb_max = _plan(T, nh)
    b = _carve(scratch, _layout(nh, nb_max, C, K, V, G, Kd))
    b["carry"].copy_(s0)
    for c0 in range(0, N, nb_max):
        nb = min(nb_max, N - c0)
        t0, t1 = c0 * C, min(T, (c0 + nb) * C)
        b = _carve(scratch, _layout(nh, nb, C, K, V, G, Kd))   # same offsets for "carry"
        E = nb * nh
        for name, src, pad in (("d", d, 1.0), ("beta", beta, 0.0), ("k", k, 0.0),
                               ("v", v, 0.0)):
            _load(b[name].view(nb, nh, C, -1), src[:, t0:t1], C, pad)
        _load(b["q"].view(nb, nh, G, C, K), q[:, :, t0:t1], C, 0.0)
        _intra_chunk(b, E, C, G, K)
        _carry(b, nb, nh, C, K)
        # O = (Γ⊙Q) S0 + P δ, batched over the block's chunks and heads
        torch.bmm(b["qg"], b["states"].view(E, K, V), out=b["o"])
        b["o"].baddbmm_(b["P"], b["delta"])
        _store(out[:, :, t0:t1], b["o"].view(nb, nh, G, C, V), C)
    final.copy_(b["carry"])


# ---- entry points ------------------------------------------------------------------------------
def _run(ins, outs, scratch) -> None:
    q, k, v, d, beta, s0 = (t.contiguous() for t in ins)
    out, final = outs
    B, Hq, T, K = q.shape
    Hs, V = k.shape[1], v.shape[3]
    R, G = B * Hs, Hq // Hs
    Kd = K if d.dim() == 4 else 1
    if T == 0:
        final.copy_(s0)
        return
    qs, ks, vs = q.view(R, G, T, K), k.view(R, T, K), v.view(R, T, V)
    ds, bs, ss = d.view(R, T, Kd), beta.view(R, T, 1), s0.view(R, K, V)
    os_, fs = out.view(R, G, T, V), final.view(R, K, V)
    if T == 1:
        # ~0.1 ms of work on a 1 MB state: a pool hand-off costs more than it saves
        _recurrent_decode(qs[:, :, 0], ks[:, 0], vs[:, 0], ds[:, 0], bs.view(R), ss,
                          os_[:, :, 0], fs)
        return
    pool = get_pool()
    w = max(1, min(pool.num_threads, R))
    bounds = [R * i // w for i in range(w + 1)]
    per = max(_per_worker(T, bounds[i + 1] - bounds[i], K, V, G, Kd) for i in range(w))
    slices = worker_slices(scratch, w, per)

    def task(i: int) -> None:
        a, z = bounds[i], bounds[i + 1]
        _chunked_prefill(qs[a:z], ks[a:z], vs[a:z], ds[a:z], bs[a:z], ss[a:z], os_[a:z],
                         fs[a:z], slices[i])

    pool.run([task] * w)


@register_kernel("gated_delta_rule", scratch_nbytes=scratch_nbytes)
def gated_delta_rule_kernel(ins, outs, attrs, scratch) -> None:
    with single_threaded_torch():
        _run(ins, outs, scratch)


_ARENA = ScratchArena()
_ARENA_LOCK = threading.Lock()   # one module-level arena: calls through it take turns


def run_into(ins: list, out: torch.Tensor, final: torch.Tensor):
    """Run on already validated tensors into out and final, outside any executor (the eager
    entry delegate.ops.gated_delta_rule.gated_delta_rule validates first)."""
    shapes = [tuple(t.shape) for t in ins]
    if shapes[0][2] <= 1:                      # decode needs no scratch: skip the arena
        with single_threaded_torch():
            _run(ins, [out, final], None)
        return out, final
    with _ARENA_LOCK:
        scratch = _ARENA.reserve(scratch_nbytes(shapes, {}, get_pool().num_threads))
        with single_threaded_torch():
            _run(ins, [out, final], scratch)
    return out, final

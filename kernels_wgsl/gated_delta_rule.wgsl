// Gated delta rule. Per state head s, token t, decay d_t already exponentiated (per key channel,
// or one scalar broadcast over the channels):
//   δ_t = β_t (v_t - (d_t ⊙ k_t)^T S),   S' = diag(d_t) S + k_t δ_t^T,   o_t = S'^T q_t
// and o_t = ((d_t ⊙ q_t)^T S) + (q_t · k_t) δ_t reads only the old S, so one workgroup
// reduction per token gives δ and every output (query heads s*G .. s*G+G-1 read state s).
//
// recurrent (one workgroup per (batch, state head, VB value columns)): the K x VB state slice
// lives in registers, thread (kl, vc) holding rows kl + KL*j of column vc; sums over K meet in
// workgroup memory. With p.tokens = 0 it only copies initial_state into final_state, which is
// how the chunked route starts its carry.
//
// Chunked prefill, chunks of C tokens, Γ_t = Π_{j<=t} d_j from the chunk's start (its
// reference point, so every exponent is chunk-local):
//   A_ti = Σ_c k_tc k_ic Γ_tc/Γ_ic (i < t),   P_ti = Σ_c q_tc k_ic Γ_tc/Γ_ic (i <= t)
//   (I + diag(β) A) [W | U] = diag(β) [Γ⊙K | V]          (forward substitution)
//   δ = U - W S,   O = (Γ⊙Q) S + P δ,   S' = diag(Γ_L) S + (K ⊙ Γ_L/Γ)^T δ
// chunk_prep (one workgroup per (batch, state head, chunk)) writes everything state
// independent to a record; chunk_scan (one workgroup per (batch, state head, VB columns)) walks
// the chunks in order carrying S. Γ_t/Γ_i is formed as (k Γ_t)(k / Γ_i) only while
// log Γ >= -SAFE, so 1/Γ <= e^SAFE stays finite. A chunk with a decay outside (0, 1] (a 0, a
// NaN) or log Γ below -SAFE (decays near 1e-12) is flagged, and chunk_scan runs that chunk
// token by token (exact). A ragged last chunk pads k = q = v = β = 0, d = 1 (state unchanged).
// The prelude (gated_delta_rule.py) defines KL, VB, NK, GB, C, KT, WSH and SAFE.

struct GdrParams {
    batch: u32, hq: u32, hs: u32, t: u32,
    k: u32, v: u32, g: u32, kd: u32,            // kd: K (channelwise decay) or 1 (scalar)
    vblocks: u32, tokens: u32, seg_first: u32, seg_cap: u32,
    seg_chunks: u32, rec: u32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<uniform> p: GdrParams;
@group(0) @binding(1) var<storage, read> q: array<f32>;       // [B, Hq, T, K]
@group(0) @binding(2) var<storage, read> k: array<f32>;       // [B, Hs, T, K]
@group(0) @binding(3) var<storage, read> v: array<f32>;       // [B, Hs, T, V]
@group(0) @binding(4) var<storage, read> d: array<f32>;       // [B, Hs, T, Kd]
@group(0) @binding(5) var<storage, read> beta: array<f32>;    // [B, Hs, T]
@group(0) @binding(6) var<storage, read> s0: array<f32>;      // [B, Hs, K, V] (recurrent)
@group(0) @binding(6) var<storage, read_write> rec: array<f32>;   // chunk records (chunked)
@group(0) @binding(7) var<storage, read_write> out: array<f32>;   // [B, Hq, T, V]
@group(0) @binding(8) var<storage, read_write> final_state: array<f32>; // [B, Hs, K, V]

const THREADS: u32 = 256u;
const RED_SLOTS: u32 = 1u + 2u * GB;          // pred, then (d⊙q)^T S and q·k per query head
const RED_HALF: u32 = RED_SLOTS * THREADS;

var<workgroup> wsh: array<f32, WSH>;          // token reductions, or the chunk's S and δ

// ---- work of a state-carrying workgroup ---------------------------------------------------
struct Lane { bs: u32, b: u32, s: u32, kl: u32, vc: u32, v: u32, live: bool }

fn lane_of(wg: u32, tid: u32) -> Lane {
    let bs = wg / p.vblocks;
    let vc = tid / KL;
    let col = (wg % p.vblocks) * VB + vc;
    return Lane(bs, bs / p.hs, bs % p.hs, tid % KL, vc, col, col < p.v);
}

// A thread's rows of its column, from initial_state (recurrent) or final_state (chunk_scan,
// which carries the state there between segments).
fn load_initial(l: Lane) -> array<f32, NK> {
    var st: array<f32, NK>;
    for (var j = 0u; j < NK; j = j + 1u) {
        let c = l.kl + KL * j;
        if (c < p.k && l.live) {
            st[j] = s0[(l.bs * p.k + c) * p.v + l.v];
        }
    }
    return st;
}

fn load_carried(l: Lane) -> array<f32, NK> {
    var st: array<f32, NK>;
    for (var j = 0u; j < NK; j = j + 1u) {
        let c = l.kl + KL * j;
        if (c < p.k && l.live) {
            st[j] = final_state[(l.bs * p.k + c) * p.v + l.v];
        }
    }
    return st;
}

fn store_state(st: ptr<function, array<f32, NK>>, l: Lane) {
    for (var j = 0u; j < NK; j = j + 1u) {
        let c = l.kl + KL * j;
        if (c < p.k && l.live) {
            final_state[(l.bs * p.k + c) * p.v + l.v] = (*st)[j];
        }
    }
}

fn decay_at(row: u32, c: u32) -> f32 {
    return d[row * p.kd + select(0u, c, p.kd > 1u)];
}

// Sum of slot `slot` over the KL lanes of column vc, in half `base` of the reduction buffer.
fn lane_sum(base: u32, slot: u32, vc: u32) -> f32 {
    var acc = 0.0;
    let at = base + slot * THREADS + vc * KL;
    for (var i = 0u; i < KL; i = i + 1u) {
        acc = acc + wsh[at + i];
    }
    return acc;
}

// One token of the recurrence on this thread's state rows. Reductions alternate between the
// two halves of wsh, so one barrier per round of GB query heads suffices.
fn token_step(st: ptr<function, array<f32, NK>>, l: Lane, tt: u32, tid: u32,
              phase: ptr<function, u32>) {
    let row = l.bs * p.t + tt;
    var kk: array<f32, NK>;
    var dk: array<f32, NK>;
    var pred = 0.0;
    for (var j = 0u; j < NK; j = j + 1u) {
        let c = l.kl + KL * j;
        if (c < p.k) {
            kk[j] = k[row * p.k + c];
            dk[j] = decay_at(row, c);
            pred = fma(dk[j] * kk[j], (*st)[j], pred);
        }
    }
    let vt = select(0.0, v[row * p.v + min(l.v, p.v - 1u)], l.live);
    let bt = beta[row];
    var delta = 0.0;
    for (var g0 = 0u; g0 < p.g; g0 = g0 + GB) {
        let base = (*phase & 1u) * RED_HALF;
        wsh[base + tid] = pred;
        for (var gi = 0u; gi < GB; gi = gi + 1u) {
            var qs = 0.0;
            var qk = 0.0;
            let g = g0 + gi;
            if (g < p.g) {
                let qrow = (l.b * p.hq + l.s * p.g + g) * p.t + tt;
                for (var j = 0u; j < NK; j = j + 1u) {
                    let c = l.kl + KL * j;
                    if (c < p.k) {
                        let qc = q[qrow * p.k + c];
                        qs = fma(dk[j] * qc, (*st)[j], qs);
                        qk = fma(qc, kk[j], qk);
                    }
                }
            }
            wsh[base + (1u + 2u * gi) * THREADS + tid] = qs;
            wsh[base + (2u + 2u * gi) * THREADS + tid] = qk;
        }
        workgroupBarrier();
        *phase = *phase + 1u;
        if (g0 == 0u) {
            delta = bt * (vt - lane_sum(base, 0u, l.vc));
        }
        // lane gi of a column writes query head g0 + gi
        let g = g0 + l.kl;
        if (l.kl < GB && g < p.g && l.live) {
            let o = lane_sum(base, 1u + 2u * l.kl, l.vc) + lane_sum(base, 2u + 2u * l.kl, l.vc) * delta;
            out[((l.b * p.hq + l.s * p.g + g) * p.t + tt) * p.v + l.v] = o;
        }
    }
    for (var j = 0u; j < NK; j = j + 1u) {
        (*st)[j] = fma(dk[j], (*st)[j], kk[j] * delta);
    }
}

@compute @workgroup_size(THREADS)
fn recurrent(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    let wg = wg_linear(wid, nwg);
    if (wg >= p.batch * p.hs * p.vblocks) {
        return;
    }
    let l = lane_of(wg, tid);
    var st = load_initial(l);
    var phase = 0u;
    for (var tt = 0u; tt < p.tokens; tt = tt + 1u) {
        token_step(&st, l, tt, tid, &phase);
    }
    store_state(&st, l);
}

// ---- chunk records ------------------------------------------------------------------------
// Per (batch, state head, chunk of the segment), p.rec floats: flag, Γ [C,K], K⊙Γ_L/Γ [C,K],
// Γ⊙Q [G,C,K], W [C,K], U [C,V], P [G,C,C].
struct Rec { flag: u32, gam: u32, kend: u32, qg: u32, w: u32, u: u32, pm: u32 }

fn rec_of(bs: u32, n: u32) -> Rec {
    let base = (bs * p.seg_cap + n) * p.rec;
    let gam = base + 4u;
    let kend = gam + C * p.k;
    let qg = kend + C * p.k;
    let w = qg + p.g * C * p.k;
    let u = w + C * p.k;
    return Rec(base, gam, kend, qg, w, u, u + C * p.v);
}

fn chunk_len(n: u32) -> u32 {
    return min(C, p.t - (p.seg_first + n) * C);
}

// ---- chunk_prep ---------------------------------------------------------------------------
const KS: u32 = KT + 1u;                       // padded tile row: no bank conflicts on columns
const NE: u32 = C * C / THREADS;               // (t, i) entries of A and P per thread
var<workgroup> kg_tile: array<f32, C * KS>;    // k Γ
var<workgroup> ki_tile: array<f32, C * KS>;    // k / Γ
var<workgroup> qg_tile: array<f32, C * KS>;    // q Γ
var<workgroup> a_beta: array<f32, C * C>;      // diag(β) A, strict lower triangle
var<workgroup> bad_any: atomic<u32>;
var<workgroup> bad_flag: u32;

// Thread c < K: the decay prefix of channel c, Γ and K⊙Γ_L/Γ into the record. True when the
// chunk needs the exact route.
fn decay_prefix(r: Rec, row0: u32, len: u32, c: u32) -> bool {
    var g = 0.0;
    var bad = false;
    for (var t = 0u; t < C; t = t + 1u) {
        var dv = 1.0;
        if (t < len) {
            dv = decay_at(row0 + t, c);
        }
        bad = bad || !(dv > 0.0 && dv <= 1.0);   // also catches NaN
        g = g + log(max(dv, 1e-38));
        bad = bad || g < -SAFE;
        rec[r.gam + t * p.k + c] = exp(g);
    }
    let g_end = g;
    g = 0.0;
    for (var t = 0u; t < C; t = t + 1u) {
        var dv = 1.0;
        var kv = 0.0;
        if (t < len) {
            dv = decay_at(row0 + t, c);
            kv = k[(row0 + t) * p.k + c];
        }
        g = g + log(max(dv, 1e-38));
        rec[r.kend + t * p.k + c] = kv * exp(g_end - g);
    }
    return bad;
}

// Stage channels c0 .. c0+KT of k Γ, k / Γ and q Γ (query head g); Γ⊙Q also goes to the record.
fn load_tiles(r: Rec, row0: u32, len: u32, qrow0: u32, g: u32, c0: u32, tid: u32) {
    for (var e = tid; e < C * KT; e = e + THREADS) {
        let t = e / KT;
        let c = c0 + e % KT;
        var kv = 0.0;
        var qv = 0.0;
        var gm = 1.0;
        if (c < p.k && t < len) {
            kv = k[(row0 + t) * p.k + c];
            qv = q[(qrow0 + t) * p.k + c];
            gm = rec[r.gam + t * p.k + c];
        }
        kg_tile[t * KS + e % KT] = kv * gm;
        ki_tile[t * KS + e % KT] = kv / gm;
        qg_tile[t * KS + e % KT] = qv * gm;
        if (c < p.k) {
            rec[r.qg + (g * C + t) * p.k + c] = qv * gm;
        }
    }
}

@compute @workgroup_size(THREADS)
fn chunk_prep(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) tid: u32) {
    let wg = wg_linear(wid, nwg);
    if (wg >= p.batch * p.hs * p.seg_chunks) {
        return;
    }
    let bs = wg / p.seg_chunks;
    let n = wg % p.seg_chunks;
    let r = rec_of(bs, n);
    let len = chunk_len(n);
    let row0 = bs * p.t + (p.seg_first + n) * C;
    if (tid == 0u) {
        atomicStore(&bad_any, 0u);   // workgroup memory is not zeroed on every driver
    }
    workgroupBarrier();
    if (tid < p.k) {
        if (decay_prefix(r, row0, len, tid)) {
            atomicOr(&bad_any, 1u);
        }
    }
    workgroupBarrier();
    if (tid == 0u) {
        bad_flag = atomicLoad(&bad_any);
        rec[r.flag] = f32(bad_flag);
    }
    if (workgroupUniformLoad(&bad_flag) != 0u) {
        return;   // chunk_scan takes this chunk token by token
    }
    storageBarrier();   // Γ written by other threads is read below
    var a_acc: array<f32, NE>;
    let b = bs / p.hs;
    let s = bs % p.hs;
    for (var g = 0u; g < p.g; g = g + 1u) {
        var p_acc = array<f32, NE>();   // explicit: naga may not re-zero a loop-local var
        let qrow0 = (b * p.hq + s * p.g + g) * p.t + (p.seg_first + n) * C;
        for (var c0 = 0u; c0 < p.k; c0 = c0 + KT) {
            workgroupBarrier();
            load_tiles(r, row0, len, qrow0, g, c0, tid);
            workgroupBarrier();
            for (var j = 0u; j < NE; j = j + 1u) {
                let e = tid + THREADS * j;
                let t = e / C;
                let i = e % C;
                if (i <= t) {
                    var pa = 0.0;
                    var aa = 0.0;
                    for (var c = 0u; c < KT; c = c + 1u) {
                        let kic = ki_tile[i * KS + c];
                        pa = fma(qg_tile[t * KS + c], kic, pa);
                        aa = fma(kg_tile[t * KS + c], kic, aa);
                    }
                    p_acc[j] = p_acc[j] + pa;
                    if (g == 0u) {
                        a_acc[j] = a_acc[j] + aa;
                    }
                }
            }
        }
        for (var j = 0u; j < NE; j = j + 1u) {
            let e = tid + THREADS * j;
            rec[r.pm + (g * C + e / C) * C + e % C] = select(0.0, p_acc[j], e % C <= e / C);
        }
    }
    for (var j = 0u; j < NE; j = j + 1u) {
        let e = tid + THREADS * j;
        let t = e / C;
        let bt = select(0.0, beta[row0 + min(t, len - 1u)], t < len);
        a_beta[e] = select(0.0, bt * a_acc[j], e % C < t);
    }
    workgroupBarrier();
    solve_wy(r, row0, len, tid);
}

// Forward substitution down the chunk, one column of [W | U] per thread:
//   x_t = β_t rhs_t - Σ_{i<t} β_t A_ti x_i.
fn solve_wy(r: Rec, row0: u32, len: u32, tid: u32) {
    for (var col = tid; col < p.k + p.v; col = col + THREADS) {
        var x: array<f32, C>;
        for (var t = 0u; t < len; t = t + 1u) {
            let row = row0 + t;
            var rhs: f32;
            if (col < p.k) {
                rhs = k[row * p.k + col] * rec[r.gam + t * p.k + col];
            } else {
                rhs = v[row * p.v + col - p.k];
            }
            var acc = beta[row] * rhs;
            for (var i = 0u; i < t; i = i + 1u) {
                acc = fma(-a_beta[t * C + i], x[i], acc);
            }
            x[t] = acc;
            if (col < p.k) {
                rec[r.w + t * p.k + col] = acc;
            } else {
                rec[r.u + t * p.v + col - p.k] = acc;
            }
        }
    }
}

// ---- chunk_scan ---------------------------------------------------------------------------
// wsh holds S [K, VB] at 0 and δ [C, VB] at SD while a chunk takes the WY route.
const SD: u32 = WSH - C * VB;

fn chunk_step(st: ptr<function, array<f32, NK>>, l: Lane, n: u32, tid: u32) {
    let r = rec_of(l.bs, n);
    let len = chunk_len(n);
    let t0 = (p.seg_first + n) * C;
    let col0 = l.v - l.vc;
    for (var j = 0u; j < NK; j = j + 1u) {
        let c = l.kl + KL * j;
        if (c < p.k) {
            wsh[c * VB + l.vc] = (*st)[j];
        }
    }
    workgroupBarrier();
    // δ = U - W S
    for (var e = tid; e < len * VB; e = e + THREADS) {
        let t = e / VB;
        let vc = e % VB;
        var acc = 0.0;
        if (col0 + vc < p.v) {
            acc = rec[r.u + t * p.v + col0 + vc];
            for (var c = 0u; c < p.k; c = c + 1u) {
                acc = fma(-rec[r.w + t * p.k + c], wsh[c * VB + vc], acc);
            }
        }
        wsh[SD + e] = acc;
    }
    workgroupBarrier();
    // O = (Γ⊙Q) S + P δ
    for (var e = tid; e < p.g * len * VB; e = e + THREADS) {
        let g = e / (len * VB);
        let t = (e / VB) % len;
        let vc = e % VB;
        if (col0 + vc < p.v) {
            var acc = 0.0;
            for (var c = 0u; c < p.k; c = c + 1u) {
                acc = fma(rec[r.qg + (g * C + t) * p.k + c], wsh[c * VB + vc], acc);
            }
            for (var i = 0u; i <= t; i = i + 1u) {
                acc = fma(rec[r.pm + (g * C + t) * C + i], wsh[SD + i * VB + vc], acc);
            }
            out[((l.b * p.hq + l.s * p.g + g) * p.t + t0 + t) * p.v + col0 + vc] = acc;
        }
    }
    // S' = diag(Γ_L) S + (K ⊙ Γ_L/Γ)^T δ
    for (var j = 0u; j < NK; j = j + 1u) {
        let c = l.kl + KL * j;
        if (c < p.k) {
            var acc = rec[r.gam + (len - 1u) * p.k + c] * (*st)[j];
            for (var i = 0u; i < len; i = i + 1u) {
                acc = fma(rec[r.kend + i * p.k + c], wsh[SD + i * VB + l.vc], acc);
            }
            (*st)[j] = acc;
        }
    }
}

@compute @workgroup_size(THREADS)
fn chunk_scan(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) tid: u32) {
    let wg = wg_linear(wid, nwg);
    if (wg >= p.batch * p.hs * p.vblocks) {
        return;
    }
    let l = lane_of(wg, tid);
    var st = load_carried(l);
    var phase = 0u;
    for (var n = 0u; n < p.seg_chunks; n = n + 1u) {
        workgroupBarrier();   // the previous chunk's readers of wsh are done
        if (tid == 0u) {
            bad_flag = u32(rec[rec_of(l.bs, n).flag]);
        }
        if (workgroupUniformLoad(&bad_flag) != 0u) {
            let t0 = (p.seg_first + n) * C;
            for (var tt = t0; tt < t0 + chunk_len(n); tt = tt + 1u) {
                token_step(&st, l, tt, tid, &phase);
            }
        } else {
            chunk_step(&st, l, n, tid);
        }
    }
    store_state(&st, l);
}

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
//   [W | U] = R diag(β) [Γ⊙K | V],   R = (I + diag(β) A)^-1
//   δ = U - W S,   O = (Γ⊙Q) S + tril(P) δ,   S' = diag(Γ_L) S + (K ⊙ Γ_L/Γ)^T δ
// in three passes per segment of chunks, as FLA's chunk_fwd (prep, chunk_fwd_h, chunk_fwd_o):
//   chunk_prep  (batch, state head, chunk): every state-independent term into the chunk's record
//   chunk_scan  (batch, state head, BV value columns): the only serial pass, chunk after chunk:
//               snapshot H_n = S, δ (over U), S'; its K x BV slice of S in workgroup memory
//   chunk_out   (batch, query head, chunk, OV value columns): O from H_n and δ, all chunks at once
// Γ_t/Γ_i is formed as (k Γ_t)(k / Γ_i) only while log Γ >= -SAFE, so 1/Γ <= e^SAFE stays
// finite. A chunk with a decay outside (0, 1] (a 0, a NaN) or log Γ below -SAFE (decays near
// 1e-12) is flagged: chunk_scan runs it token by token (exact) and chunk_out skips it. A ragged
// last chunk pads k = q = v = β = 0, d = 1 (state unchanged). Sums that a triangle bounds (i <= t)
// skip the other terms by select, never multiply them by 0: a NaN past token t must not reach
// the outputs before it, as in the token loop.
// The prelude (gated_delta_rule.py) defines the head sizes (DK, DV, KP, VP = K, V padded to 4,
// G, KD), C, KT, SAFE, the record offsets R_*, the token lanes (KL, VB, NK, GB), the scan tile
// (BV, NVQ, TC, KSPLIT, NS), the output tile (OV, BR), and every workgroup array's size.

struct GdrParams {
    batch: u32, hq: u32, hs: u32, t: u32,
    vblocks: u32, tokens: u32, seg_first: u32, seg_cap: u32,
    seg_chunks: u32, oblocks: u32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<uniform> p: GdrParams;
@group(0) @binding(1) var<storage, read> q: array<f32>;       // [B, Hq, T, K]
@group(0) @binding(2) var<storage, read> k: array<f32>;       // [B, Hs, T, K]
@group(0) @binding(3) var<storage, read> v: array<f32>;       // [B, Hs, T, V]
@group(0) @binding(4) var<storage, read> d: array<f32>;       // [B, Hs, T, Kd]
@group(0) @binding(5) var<storage, read> beta: array<f32>;    // [B, Hs, T]
@group(0) @binding(6) var<storage, read> s0: array<f32>;      // [B, Hs, K, V] (recurrent)
@group(0) @binding(6) var<storage, read_write> rec: array<f32>;   // chunk records (prep, scan)
@group(0) @binding(6) var<storage, read> rec_in: array<f32>;      // chunk records (chunk_out)
@group(0) @binding(7) var<storage, read_write> out: array<f32>;   // [B, Hq, T, V]
@group(0) @binding(8) var<storage, read_write> final_state: array<f32>; // [B, Hs, K, V]

const THREADS: u32 = 256u;
const RED_SLOTS: u32 = 1u + 2u * GB;          // pred, then (d⊙q)^T S and q·k per query head
const RED_HALF: u32 = RED_SLOTS * THREADS;

var<workgroup> wsh: array<f32, WSH>;          // token reductions, or chunk_scan's staged rows
var<workgroup> bad_any: atomic<u32>;
var<workgroup> bad_flag: u32;

// ---- work of a token-stepping workgroup ---------------------------------------------------
struct Lane { bs: u32, b: u32, s: u32, kl: u32, vc: u32, v: u32, live: bool }

fn lane_of(wg: u32, tid: u32) -> Lane {
    let bs = wg / p.vblocks;
    let vc = tid / KL;
    let col = (wg % p.vblocks) * VB + vc;
    return Lane(bs, bs / p.hs, bs % p.hs, tid % KL, vc, col, col < DV);
}

fn load_initial(l: Lane) -> array<f32, NK> {
    var st: array<f32, NK>;
    for (var j = 0u; j < NK; j = j + 1u) {
        let c = l.kl + KL * j;
        if (c < DK && l.live) {
            st[j] = s0[(l.bs * DK + c) * DV + l.v];
        }
    }
    return st;
}

fn store_state(st: ptr<function, array<f32, NK>>, l: Lane) {
    for (var j = 0u; j < NK; j = j + 1u) {
        let c = l.kl + KL * j;
        if (c < DK && l.live) {
            final_state[(l.bs * DK + c) * DV + l.v] = (*st)[j];
        }
    }
}

fn decay_at(row: u32, c: u32) -> f32 {
    return d[row * KD + select(0u, c, KD > 1u)];
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
        if (c < DK) {
            kk[j] = k[row * DK + c];
            dk[j] = decay_at(row, c);
            pred = fma(dk[j] * kk[j], (*st)[j], pred);
        }
    }
    let vt = select(0.0, v[row * DV + min(l.v, DV - 1u)], l.live);
    let bt = beta[row];
    var delta = 0.0;
    for (var g0 = 0u; g0 < G; g0 = g0 + GB) {
        let base = (*phase & 1u) * RED_HALF;
        wsh[base + tid] = pred;
        for (var gi = 0u; gi < GB; gi = gi + 1u) {
            var qs = 0.0;
            var qk = 0.0;
            let g = g0 + gi;
            if (g < G) {
                let qrow = (l.b * p.hq + l.s * G + g) * p.t + tt;
                for (var j = 0u; j < NK; j = j + 1u) {
                    let c = l.kl + KL * j;
                    if (c < DK) {
                        let qc = q[qrow * DK + c];
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
        if (l.kl < GB && g < G && l.live) {
            let o = lane_sum(base, 1u + 2u * l.kl, l.vc) + lane_sum(base, 2u + 2u * l.kl, l.vc) * delta;
            out[((l.b * p.hq + l.s * G + g) * p.t + tt) * DV + l.v] = o;
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
// Per (batch, state head, chunk of the segment), REC floats at the R_* offsets: flag (padded to
// 4), Γ_L [KP], Γ [C,KP], K⊙Γ_L/Γ [C,KP], W [C,KP], U [C,VP] (δ once chunk_scan has run),
// Γ⊙Q [G,C,KP], P [G,C,C], H [KP,VP] (S at the chunk's start). Padding rows and columns hold 0.
fn rec_base(bs: u32, n: u32) -> u32 {
    return (bs * p.seg_cap + n) * REC;
}

fn chunk_len(n: u32) -> u32 {
    return min(C, p.t - (p.seg_first + n) * C);
}

// ---- chunk_prep ---------------------------------------------------------------------------
const KS: u32 = KT + 1u;                       // padded tile row: no bank conflicts on columns
const C4: u32 = C / 4u;
var<workgroup> kg_tile: array<f32, PREP_TILE>; // k Γ      [C][KS]
var<workgroup> ki_tile: array<f32, PREP_TILE>; // k / Γ    [C][KS]
var<workgroup> qg_tile: array<f32, PREP_TILE>; // q Γ      [C][KS]
var<workgroup> a_beta: array<f32, PREP_CC>;    // diag(β) A, strict lower triangle [t][i]
var<workgroup> r_inv: array<vec4<f32>, PREP_CC4>;  // R [t][i / 4], 0 above the diagonal

fn decay_or_one(row0: u32, t: u32, len: u32, c: u32) -> f32 {
    if (t < len && c < DK) {
        return decay_at(row0 + t, c);
    }
    return 1.0;
}

// Tokens t .. t+3 of channel c: four loads in flight at once.
fn decay4(row0: u32, t: u32, len: u32, c: u32) -> vec4<f32> {
    return vec4<f32>(decay_or_one(row0, t, len, c), decay_or_one(row0, t + 1u, len, c),
                     decay_or_one(row0, t + 2u, len, c), decay_or_one(row0, t + 3u, len, c));
}

fn key_or_zero(row0: u32, t: u32, len: u32, c: u32) -> f32 {
    if (t < len && c < DK) {
        return k[(row0 + t) * DK + c];
    }
    return 0.0;
}

// Thread c < KP: the decay prefix of channel c; Γ, Γ_L and K⊙Γ_L/Γ into the record. True when
// the chunk needs the exact route.
fn decay_prefix(r: u32, row0: u32, len: u32, c: u32) -> bool {
    var g = 0.0;
    var bad = false;
    for (var t0 = 0u; t0 < C; t0 = t0 + 4u) {
        let d4 = decay4(row0, t0, len, c);
        for (var m = 0u; m < 4u; m = m + 1u) {
            let dv = d4[m];
            bad = bad || is_nan(dv) || !(dv > 0.0 && dv <= 1.0);
            g = g + log(max(dv, 1e-38));
            bad = bad || g < -SAFE;
            rec[r + R_GAM + (t0 + m) * KP + c] = exp(g);
        }
    }
    rec[r + R_GL + c] = exp(g);
    let g_end = g;
    g = 0.0;
    for (var t0 = 0u; t0 < C; t0 = t0 + 4u) {
        let d4 = decay4(row0, t0, len, c);
        let k4 = vec4<f32>(key_or_zero(row0, t0, len, c), key_or_zero(row0, t0 + 1u, len, c),
                           key_or_zero(row0, t0 + 2u, len, c), key_or_zero(row0, t0 + 3u, len, c));
        for (var m = 0u; m < 4u; m = m + 1u) {
            g = g + log(max(d4[m], 1e-38));
            rec[r + R_KEND + (t0 + m) * KP + c] = k4[m] * exp(g_end - g);
        }
    }
    return bad;
}

// (k, q, Γ) of tile entry e (row e / KT, channel c0 + e % KT); k = q = 0, Γ = 1 past the ends.
fn tile_entry(r: u32, row0: u32, len: u32, qrow0: u32, c0: u32, e: u32) -> vec3<f32> {
    let t = e / KT;
    let c = c0 + e % KT;
    if (c < DK && t < len) {
        return vec3<f32>(k[(row0 + t) * DK + c], q[(qrow0 + t) * DK + c],
                         rec[r + R_GAM + t * KP + c]);
    }
    return vec3<f32>(0.0, 0.0, 1.0);
}

fn store_entry(r: u32, g: u32, c0: u32, e: u32, x: vec3<f32>) {
    let t = e / KT;
    let c = c0 + e % KT;
    kg_tile[t * KS + e % KT] = x.x * x.z;
    ki_tile[t * KS + e % KT] = x.x / x.z;
    qg_tile[t * KS + e % KT] = x.y * x.z;
    if (c < KP) {
        rec[r + R_QG + (g * C + t) * KP + c] = x.y * x.z;
    }
}

// Stage channels c0 .. c0+KT of k Γ, k / Γ and q Γ (query head g); Γ⊙Q also goes to the record.
// C * KT = 2 * THREADS entries: a thread loads both of its entries before storing either.
fn load_tiles(r: u32, row0: u32, len: u32, qrow0: u32, g: u32, c0: u32, tid: u32) {
    let x0 = tile_entry(r, row0, len, qrow0, c0, tid);
    let x1 = tile_entry(r, row0, len, qrow0, c0, tid + THREADS);
    store_entry(r, g, c0, tid, x0);
    store_entry(r, g, c0, tid + THREADS, x1);
}

// P [g] into the record and (for g = 0) diag(β) A into a_beta. Thread tid owns entries (t, i)
// with i = tid % C and t = tid / C + 8j, j < 4 (C * C = 4 * THREADS): the vec4 holds its rows.
fn attention_terms(r: u32, bs: u32, n: u32, row0: u32, len: u32, tid: u32) {
    let i = tid % C;
    let t0 = tid / C;
    let tv = vec4<u32>(t0, t0 + 8u, t0 + 16u, t0 + 24u);
    for (var g = 0u; g < G; g = g + 1u) {
        var pa = vec4<f32>(0.0);
        var aa = vec4<f32>(0.0);
        let qrow0 = ((bs / p.hs) * p.hq + (bs % p.hs) * G + g) * p.t + (p.seg_first + n) * C;
        for (var c0 = 0u; c0 < KP; c0 = c0 + KT) {
            workgroupBarrier();
            load_tiles(r, row0, len, qrow0, g, c0, tid);
            workgroupBarrier();
            for (var c = 0u; c < KT; c = c + 1u) {
                let kic = vec4<f32>(ki_tile[i * KS + c]);
                pa = fma(vec4<f32>(qg_tile[tv.x * KS + c], qg_tile[tv.y * KS + c],
                                   qg_tile[tv.z * KS + c], qg_tile[tv.w * KS + c]), kic, pa);
                if (g == 0u) {
                    aa = fma(vec4<f32>(kg_tile[tv.x * KS + c], kg_tile[tv.y * KS + c],
                                       kg_tile[tv.z * KS + c], kg_tile[tv.w * KS + c]), kic, aa);
                }
            }
        }
        for (var j = 0u; j < 4u; j = j + 1u) {
            rec[r + R_PM + (g * C + tv[j]) * C + i] = select(0.0, pa[j], i <= tv[j]);
            if (g == 0u) {
                let bt = select(0.0, beta[row0 + min(tv[j], len - 1u)], tv[j] < len);
                a_beta[tv[j] * C + i] = select(0.0, bt * aa[j], i < tv[j]);
            }
        }
    }
}

// Column j of R = (I + diag(β) A)^-1 by forward substitution:
//   R_tj = [t == j] - Σ_{j <= i < t} (β A)_ti R_ij.
// Every thread walks the same (t, i), so the a_beta reads are broadcasts.
fn invert_column(j: u32) {
    for (var t = 0u; t < C; t = t + 1u) {
        var acc = select(0.0, 1.0, t == j);
        for (var i = 0u; i < t; i = i + 1u) {
            let x = r_inv[i * C4 + j / 4u][j % 4u];
            acc = select(acc, fma(-a_beta[t * C + i], x, acc), i >= j);
        }
        r_inv[t * C4 + j / 4u][j % 4u] = select(0.0, acc, t >= j);
    }
}

// β_i [Γ⊙K | V]_(i, col): 0 past the chunk's end and in the padding columns.
fn rhs(r: u32, row0: u32, len: u32, i: u32, col: u32) -> f32 {
    if (i >= len) {
        return 0.0;
    }
    let row = row0 + i;
    var x = 0.0;
    if (col < DK) {
        x = k[row * DK + col] * rec[r + R_GAM + i * KP + col];
    } else if (col >= KP && col - KP < DV) {
        x = v[row * DV + col - KP];
    }
    return beta[row] * x;
}

fn rhs4(r: u32, row0: u32, len: u32, i: u32, col: u32) -> vec4<f32> {
    return vec4<f32>(rhs(r, row0, len, i, col), rhs(r, row0, len, i + 1u, col),
                     rhs(r, row0, len, i + 2u, col), rhs(r, row0, len, i + 3u, col));
}

// A column of C = 32 right-hand sides as named vec4s (indexed arrays can land in local memory).
struct Col32 { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
               a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32> }

// b[i0 .. i0+3] with the entries past row t zeroed (R_ti = 0 there: skip, do not multiply).
fn upto(b: vec4<f32>, i0: u32, t: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), b, vec4<u32>(i0) + vec4<u32>(0u, 1u, 2u, 3u) <= vec4<u32>(t));
}

fn r_row_times(t: u32, b: Col32) -> f32 {
    let row = t * C4;
    return dot(r_inv[row], upto(b.a0, 0u, t)) + dot(r_inv[row + 1u], upto(b.a1, 4u, t))
         + dot(r_inv[row + 2u], upto(b.a2, 8u, t)) + dot(r_inv[row + 3u], upto(b.a3, 12u, t))
         + dot(r_inv[row + 4u], upto(b.a4, 16u, t)) + dot(r_inv[row + 5u], upto(b.a5, 20u, t))
         + dot(r_inv[row + 6u], upto(b.a6, 24u, t)) + dot(r_inv[row + 7u], upto(b.a7, 28u, t));
}

// Column col of [W | U] = R diag(β) [Γ⊙K | V], every row of the chunk (padding rows too).
fn solve_column(r: u32, row0: u32, len: u32, col: u32) {
    let b = Col32(rhs4(r, row0, len, 0u, col), rhs4(r, row0, len, 4u, col),
                  rhs4(r, row0, len, 8u, col), rhs4(r, row0, len, 12u, col),
                  rhs4(r, row0, len, 16u, col), rhs4(r, row0, len, 20u, col),
                  rhs4(r, row0, len, 24u, col), rhs4(r, row0, len, 28u, col));
    for (var t = 0u; t < C; t = t + 1u) {
        let x = r_row_times(t, b);
        if (col < KP) {
            rec[r + R_W + t * KP + col] = x;
        } else {
            rec[r + R_U + t * VP + col - KP] = x;
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
    let r = rec_base(bs, n);
    let len = chunk_len(n);
    let row0 = bs * p.t + (p.seg_first + n) * C;
    if (tid == 0u) {
        atomicStore(&bad_any, 0u);   // workgroup memory is not zeroed on every driver
    }
    workgroupBarrier();
    if (tid < KP) {
        if (decay_prefix(r, row0, len, tid)) {
            atomicOr(&bad_any, 1u);
        }
    }
    workgroupBarrier();
    if (tid == 0u) {
        bad_flag = atomicLoad(&bad_any);
        rec[r] = f32(bad_flag);
    }
    if (workgroupUniformLoad(&bad_flag) != 0u) {
        return;   // chunk_scan takes this chunk token by token, chunk_out skips it
    }
    storageBarrier();   // Γ written by other threads is read below
    attention_terms(r, bs, n, row0, len, tid);
    workgroupBarrier();
    if (tid < C) {
        invert_column(tid);
    }
    workgroupBarrier();
    for (var col = tid; col < KP + VP; col = col + THREADS) {
        solve_column(r, row0, len, col);
    }
}

// ---- chunk_scan ---------------------------------------------------------------------------
// Workgroup (batch, state head, block of BV value columns). S [KP][BV] stays in s_cur, (row c,
// columns 4vq..4vq+3) at c*NVQ + vq. Per chunk, TC rows at a time: W and K⊙Γ_L/Γ rows staged in
// wsh, then δ = U - W S for those rows (thread (ks, t, vq) sums channels ks, ks+KSPLIT, .., the
// KSPLIT partials meet in wsh), then their share of S' into registers (thread tid owns the
// entries tid + THREADS*j of s_cur); S' replaces S once every row is done.
const TROW: u32 = KP + 1u;                     // staged row: consecutive rows on other banks
const TILE: u32 = TC * TROW;                   // K⊙Γ_L/Γ rows after the W rows
const RED: u32 = 2u * TILE;                    // one vec4 partial of δ per thread
const KR: u32 = (KP + KSPLIT - 1u) / KSPLIT;   // channels per K split
var<workgroup> s_cur: array<vec4<f32>, SCAN_S>;
var<workgroup> delta_s: array<vec4<f32>, SCAN_D>;   // δ of the staged rows [TC][NVQ]

fn carried(bs: u32, c: u32, col: u32) -> f32 {
    if (c < DK && col < DV) {
        return final_state[(bs * DK + c) * DV + col];
    }
    return 0.0;
}

fn load_carried(bs: u32, col0: u32, tid: u32) {
    for (var e = tid; e < KP * NVQ; e = e + THREADS) {
        let c = e / NVQ;
        let col = col0 + 4u * (e % NVQ);
        s_cur[e] = vec4<f32>(carried(bs, c, col), carried(bs, c, col + 1u),
                             carried(bs, c, col + 2u), carried(bs, c, col + 3u));
    }
}

fn store_carried(bs: u32, col0: u32, tid: u32) {
    for (var e = tid; e < KP * NVQ; e = e + THREADS) {
        let c = e / NVQ;
        for (var m = 0u; m < 4u; m = m + 1u) {
            let col = col0 + 4u * (e % NVQ) + m;
            if (c < DK && col < DV) {
                final_state[(bs * DK + c) * DV + col] = s_cur[e][m];
            }
        }
    }
}

// H_n: this workgroup's columns of S at the chunk's start, for chunk_out.
fn snapshot(r: u32, col0: u32, tid: u32) {
    for (var e = tid; e < KP * NVQ; e = e + THREADS) {
        let c = e / NVQ;
        for (var m = 0u; m < 4u; m = m + 1u) {
            let col = col0 + 4u * (e % NVQ) + m;
            if (col < VP) {
                rec[r + R_H + c * VP + col] = s_cur[e][m];
            }
        }
    }
}

// A thread's share of one stage (rows t0 .. t0+TC of W and K⊙Γ_L/Γ): four channels each at
// groups tid + THREADS*m, m < 4 (TC * KP <= 16 * THREADS). Fetched into registers a stage ahead
// and stored into wsh when that stage starts, so the scan never waits on the records.
struct Stage { w0: vec4<f32>, w1: vec4<f32>, w2: vec4<f32>, w3: vec4<f32>,
               k0: vec4<f32>, k1: vec4<f32>, k2: vec4<f32>, k3: vec4<f32> }

fn rec4(at: u32, live: bool) -> vec4<f32> {
    if (!live) {
        return vec4<f32>(0.0);
    }
    return vec4<f32>(rec[at], rec[at + 1u], rec[at + 2u], rec[at + 3u]);
}

fn fetch_stage(r: u32, t0: u32, tid: u32) -> Stage {
    let at = r + t0 * KP + 4u * tid;
    let n = TC * KP;
    let e = 4u * tid;
    let s = 4u * THREADS;
    return Stage(rec4(at + R_W, e < n), rec4(at + s + R_W, e + s < n),
                 rec4(at + 2u * s + R_W, e + 2u * s < n), rec4(at + 3u * s + R_W, e + 3u * s < n),
                 rec4(at + R_KEND, e < n), rec4(at + s + R_KEND, e + s < n),
                 rec4(at + 2u * s + R_KEND, e + 2u * s < n),
                 rec4(at + 3u * s + R_KEND, e + 3u * s < n));
}

fn put_group(e: u32, w: vec4<f32>, ke: vec4<f32>) {
    if (e < TC * KP) {
        let to = (e / KP) * TROW + e % KP;   // KP is a multiple of 4: a group is in one row
        for (var m = 0u; m < 4u; m = m + 1u) {
            wsh[to + m] = w[m];
            wsh[TILE + to + m] = ke[m];
        }
    }
}

fn put_stage(st: Stage, tid: u32) {
    let s = 4u * THREADS;
    put_group(4u * tid, st.w0, st.k0);
    put_group(4u * tid + s, st.w1, st.k1);
    put_group(4u * tid + 2u * s, st.w2, st.k2);
    put_group(4u * tid + 3u * s, st.w3, st.k3);
}

fn u_row(r: u32, t: u32, col: u32) -> vec4<f32> {
    var u = vec4<f32>(0.0);
    for (var m = 0u; m < 4u; m = m + 1u) {
        if (col + m < VP) {
            u[m] = rec[r + R_U + t * VP + col + m];
        }
    }
    return u;
}

// δ of staged rows t0 .. t0+TC into delta_s and over U in the record. Ends on a barrier.
fn delta_rows(r: u32, t0: u32, col0: u32, tid: u32) {
    let vq = tid % NVQ;
    let t = (tid / NVQ) % TC;
    let ks = tid / (NVQ * TC);
    let owner = tid < TC * NVQ;
    var u = vec4<f32>(0.0);
    if (owner) {
        u = u_row(r, t0 + t, col0 + 4u * vq);   // issued now, used after the sums
    }
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    for (var j = 0u; j < KR; j = j + 2u) {
        let c0 = ks + KSPLIT * j;
        let c1 = c0 + KSPLIT;
        if (c0 < KP) {
            a0 = fma(vec4<f32>(wsh[t * TROW + c0]), s_cur[c0 * NVQ + vq], a0);
        }
        if (c1 < KP) {
            a1 = fma(vec4<f32>(wsh[t * TROW + c1]), s_cur[c1 * NVQ + vq], a1);
        }
    }
    let part = a0 + a1;
    for (var m = 0u; m < 4u; m = m + 1u) {
        wsh[RED + 4u * tid + m] = part[m];
    }
    workgroupBarrier();
    if (owner) {
        var dl = u;
        for (var s = 0u; s < KSPLIT; s = s + 1u) {
            let at = RED + 4u * (s * TC * NVQ + tid);
            dl = dl - vec4<f32>(wsh[at], wsh[at + 1u], wsh[at + 2u], wsh[at + 3u]);
        }
        delta_s[tid] = dl;
        for (var m = 0u; m < 4u; m = m + 1u) {
            let col = col0 + 4u * vq + m;
            if (col < VP) {
                rec[r + R_U + (t0 + t) * VP + col] = dl[m];
            }
        }
    }
    workgroupBarrier();
}

// acc[j] += Σ_t (K⊙Γ_L/Γ)[t0 + t, c_j] δ[t0 + t, :] over the staged rows.
fn state_rows(acc: ptr<function, array<vec4<f32>, NS>>, tid: u32) {
    let vq = tid % NVQ;
    for (var j = 0u; j < NS; j = j + 1u) {
        let c = (tid + THREADS * j) / NVQ;
        if (c < KP) {
            var a = (*acc)[j];
            for (var t = 0u; t < TC; t = t + 1u) {
                a = fma(vec4<f32>(wsh[TILE + t * TROW + c]), delta_s[t * NVQ + vq], a);
            }
            (*acc)[j] = a;
        }
    }
}

// One chunk by the WY form; `pre` holds its first stage and leaves with the stage after its
// last (the first of `r_next`). s_cur keeps S until every row is done (delta_rows reads it,
// and only before its last barrier), so S' = Γ_L ⊙ S + Σ rows replaces it in place and the
// next chunk's first barrier is the only one it needs. Γ_L is loaded first and used last.
fn wy_chunk(r: u32, r_next: u32, col0: u32, tid: u32, pre: ptr<function, Stage>) {
    snapshot(r, col0, tid);
    var gl: array<f32, NS>;
    for (var j = 0u; j < NS; j = j + 1u) {
        gl[j] = rec[r + R_GL + min((tid + THREADS * j) / NVQ, KP - 1u)];
    }
    var acc: array<vec4<f32>, NS>;
    for (var t0 = 0u; t0 < C; t0 = t0 + TC) {
        workgroupBarrier();   // the previous rows' readers of wsh and delta_s are done
        put_stage(*pre, tid);
        workgroupBarrier();
        if (t0 + TC < C) {
            *pre = fetch_stage(r, t0 + TC, tid);
        } else {
            *pre = fetch_stage(r_next, 0u, tid);
        }
        delta_rows(r, t0, col0, tid);
        state_rows(&acc, tid);
    }
    for (var j = 0u; j < NS; j = j + 1u) {
        let e = tid + THREADS * j;
        if (e < KP * NVQ) {
            s_cur[e] = fma(vec4<f32>(gl[j]), s_cur[e], acc[j]);
        }
    }
}

// A flagged chunk, token by token on the lane layout (KL * VB = THREADS, VB = BV columns).
fn token_chunk(l: Lane, n: u32, tid: u32, phase: ptr<function, u32>) {
    var st: array<f32, NK>;
    for (var j = 0u; j < NK; j = j + 1u) {
        let c = l.kl + KL * j;
        if (c < DK) {
            st[j] = s_cur[c * NVQ + l.vc / 4u][l.vc % 4u];
        }
    }
    let t0 = (p.seg_first + n) * C;
    for (var tt = t0; tt < t0 + chunk_len(n); tt = tt + 1u) {
        token_step(&st, l, tt, tid, phase);
    }
    for (var j = 0u; j < NK; j = j + 1u) {
        let c = l.kl + KL * j;
        if (c < DK) {
            s_cur[c * NVQ + l.vc / 4u][l.vc % 4u] = st[j];
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
    let col0 = (wg % p.vblocks) * BV;
    load_carried(l.bs, col0, tid);
    var phase = 0u;
    var flag_next = rec[rec_base(l.bs, 0u)];
    var pre = fetch_stage(rec_base(l.bs, 0u), 0u, tid);
    for (var n = 0u; n < p.seg_chunks; n = n + 1u) {
        let r = rec_base(l.bs, n);
        // the next chunk's record: loads a chunk ahead (the last chunk's are never used)
        let r_next = rec_base(l.bs, min(n + 1u, p.seg_chunks - 1u));
        workgroupBarrier();   // the previous chunk is done with bad_flag, wsh and s_cur
        if (tid == 0u) {
            bad_flag = u32(flag_next);
        }
        flag_next = rec[r_next];
        if (workgroupUniformLoad(&bad_flag) != 0u) {
            token_chunk(l, n, tid, &phase);
            pre = fetch_stage(r_next, 0u, tid);
        } else {
            wy_chunk(r, r_next, col0, tid, &pre);
        }
    }
    workgroupBarrier();
    store_carried(l.bs, col0, tid);
}

// ---- chunk_out ----------------------------------------------------------------------------
// Workgroup (batch, query head h = s*G + g, chunk, block of OV = 128 value columns):
//   O [C, OV] = (Γ⊙Q)[g] H_n + tril(P[g]) δ
// over staged tiles of BR inner rows: a_tile holds A transposed ([i][t / 4]), b_tile B
// ([i][col / 4]). Thread (ty, tx) owns rows 4ty..4ty+3 and columns 4tx..4tx+3: per inner row one
// vec4 of each tile for 16 FMAs. A warp spans 4 ty and 8 tx, so those reads are 64 and 128
// contiguous bytes.
const OVQ: u32 = OV / 4u;
var<workgroup> a_tile: array<vec4<f32>, OUT_A>;   // [BR][C4]
var<workgroup> b_tile: array<vec4<f32>, OUT_B>;   // [BR][OVQ]

// Four consecutive floats at `at` where `live`, else 0 (rows are KP, VP or C long, multiples
// of 4, so a group is all in or all out).
fn rec_in4(at: u32, live: bool) -> vec4<f32> {
    if (!live) {
        return vec4<f32>(0.0);
    }
    return vec4<f32>(rec_in[at], rec_in[at + 1u], rec_in[at + 2u], rec_in[at + 3u]);
}

// Inner rows i0 .. i0+BR of A [C, width] at a_base and of B [width, VP] at b_base, zeros past
// width and VP. A is read four inner rows at a time along t, so its stores go down a_tile's
// columns without bank conflicts.
fn stage_out(a_base: u32, b_base: u32, width: u32, i0: u32, col0: u32, tid: u32) {
    for (var e = tid; e < C * BR / 4u; e = e + THREADS) {
        let t = e % C;
        let i = i0 + 4u * (e / C);
        let x = rec_in4(a_base + t * width + i, i < width);
        for (var m = 0u; m < 4u; m = m + 1u) {
            a_tile[(4u * (e / C) + m) * C4 + t / 4u][t % 4u] = x[m];
        }
    }
    for (var e = tid; e < BR * OVQ; e = e + THREADS) {
        let i = i0 + e / OVQ;
        let col = col0 + 4u * (e % OVQ);
        b_tile[e] = rec_in4(b_base + i * VP + col, i < width && col < VP);
    }
}

struct Rows4 { o0: vec4<f32>, o1: vec4<f32>, o2: vec4<f32>, o3: vec4<f32> }

fn mac_rows(o: Rows4, a: vec4<f32>, b: vec4<f32>) -> Rows4 {
    return Rows4(fma(vec4<f32>(a.x), b, o.o0), fma(vec4<f32>(a.y), b, o.o1),
                 fma(vec4<f32>(a.z), b, o.o2), fma(vec4<f32>(a.w), b, o.o3));
}

// Row t0 + m takes inner row i only when i <= t0 + m (the triangle of P).
fn mac_rows_upto(o: Rows4, a: vec4<f32>, b: vec4<f32>, i: u32, t0: u32) -> Rows4 {
    let x = mac_rows(o, a, b);
    return Rows4(select(o.o0, x.o0, i <= t0), select(o.o1, x.o1, i <= t0 + 1u),
                 select(o.o2, x.o2, i <= t0 + 2u), select(o.o3, x.o3, i <= t0 + 3u));
}

fn store_out(row0: u32, len: u32, t: u32, col: u32, o: vec4<f32>) {
    if (t < len) {
        for (var m = 0u; m < 4u; m = m + 1u) {
            if (col + m < DV) {
                out[(row0 + t) * DV + col + m] = o[m];
            }
        }
    }
}

@compute @workgroup_size(THREADS)
fn chunk_out(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    let wg = wg_linear(wid, nwg);
    let per_head = p.seg_chunks * p.oblocks;
    if (wg >= p.batch * p.hq * per_head) {
        return;
    }
    let bh = wg / per_head;                    // b * Hq + h
    let n = (wg % per_head) / p.oblocks;
    let col0 = (wg % p.oblocks) * OV;
    let h = bh % p.hq;
    let g = h % G;
    let r = rec_base((bh / p.hq) * p.hs + h / G, n);
    if (tid == 0u) {
        bad_flag = u32(rec_in[r]);
    }
    if (workgroupUniformLoad(&bad_flag) != 0u) {
        return;   // chunk_scan wrote this chunk's outputs token by token
    }
    let lane = tid % 32u;
    let ty = lane / 8u + 4u * ((tid / 32u) % 2u);
    let tx = lane % 8u + 8u * (tid / 64u);
    var o = Rows4(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var i0 = 0u; i0 < KP; i0 = i0 + BR) {
        workgroupBarrier();
        stage_out(r + R_QG + g * C * KP, r + R_H, KP, i0, col0, tid);
        workgroupBarrier();
        for (var i = 0u; i < BR; i = i + 1u) {
            o = mac_rows(o, a_tile[i * C4 + ty], b_tile[i * OVQ + tx]);
        }
    }
    for (var i0 = 0u; i0 < C; i0 = i0 + BR) {
        workgroupBarrier();
        stage_out(r + R_PM + g * C * C, r + R_U, C, i0, col0, tid);
        workgroupBarrier();
        for (var i = 0u; i < BR; i = i + 1u) {
            o = mac_rows_upto(o, a_tile[i * C4 + ty], b_tile[i * OVQ + tx], i0 + i, 4u * ty);
        }
    }
    let row0 = bh * p.t + (p.seg_first + n) * C;
    let len = chunk_len(n);
    store_out(row0, len, 4u * ty, col0 + 4u * tx, o.o0);
    store_out(row0, len, 4u * ty + 1u, col0 + 4u * tx, o.o1);
    store_out(row0, len, 4u * ty + 2u, col0 + 4u * tx, o.o2);
    store_out(row0, len, 4u * ty + 3u, col0 + 4u * tx, o.o3);
}

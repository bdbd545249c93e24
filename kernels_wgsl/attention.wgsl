// Flash attention. A workgroup owns BR query rows of one (batch, kv head) and streams that
// head's keys in tiles of BC staged in workgroup memory, keeping an online softmax per row
// (running max m, running sum l, accumulator acc):
//   s_j = q . k_j * scale + bias_j,   m' = max(m, max_j s_j),
//   l' = l e^(m - m') + sum_j e^(s_j - m'),   acc' = acc e^(m - m') + sum_j e^(s_j - m') v_j,
//   out = acc / l.
// Rows are (position, query head of the kv group) pairs, row = l * n_rep + head-in-group, so
// the query heads of one GQA group share every K/V tile load. A row is G adjacent threads,
// each holding VEC vec4s of the head dims (its q slice and acc slice in registers); with
// G > 1 the partial dot products meet in workgroup memory.
// bias: MASK 0 none, 1 bool (false -> -inf), 2 float (added). CAUSAL keeps keys
// s <= l + causal_offset (torch's top-left tril at offset 0; a KV cache's rows at its write
// position otherwise); a key tile wholly above a workgroup's last row is never loaded. Only
// the first kv_len keys exist (the filled part of a cache).
// Splits (flash-decoding, decode and prefill): with p.splits > 1 the key range is cut into
// p.split_len slices, one workgroup each, which write (m, l, acc) rows to `partials`; `combine`
// merges them. A split wholly above a tile's causal diagonal writes its rows as empty
// (m = EXCLUDED, l = 0, acc = 0: weight 0 in `combine`).
// NaN/Inf follow torch's eager CPU SDPA: a NaN or +inf score (NaN q/k, +inf mask) makes its
// row NaN; a NaN v_j reaches every row whose tile holds key j (p_j * NaN, even for p_j = 0);
// a fully masked row gives 0.
// Rows are numbered orow = (b * hq + h) * l + li throughout (the partials' order); q and out
// find a row's first element by their (b, h, l) strides (row_at), k and v a key's by their
// (b, h, s) strides (kv_first, then s * st.z): contiguous, or read / written through the op's
// q_dims / k_dims / v_dims / out_dims, the head dim contiguous either way.
// The prelude (attention.py) defines the tile: G, VEC, BR, BC and PARTIAL (1 when G == 1).

override MASK: u32 = 0u;
override CAUSAL: bool = false;

struct SdpaParams {
    batch: u32, hq: u32, hkv: u32, l: u32,
    s: u32, e: u32, ev: u32, n_rep: u32,
    scale: f32, tiles: u32, splits: u32, split_len: u32,
    kv_len: u32, causal_offset: u32, pad0: u32, pad1: u32,
    mask_strides: vec4<u32>,   // (b, h, l, s) element strides of the mask broadcast to scores
    q_strides: vec4<u32>,      // (b, h, l, e) element strides of q in its buffer
    k_strides: vec4<u32>,      // (b, h, s, e) element strides of k in its buffer
    v_strides: vec4<u32>,      // (b, h, s, e) element strides of v in its buffer
    out_strides: vec4<u32>,    // (b, h, l, e) element strides of the output in its buffer
}

@group(0) @binding(0) var<uniform> p: SdpaParams;
// q, k and v are vec4 arrays when both head dims are multiples of 4, else f32 arrays: the
// prelude's qkv_t, and its load_q(row) / load_k/v(first element of a row), each with a vec4
// index, reading zeros past the head dims
@group(0) @binding(1) var<storage, read> q: array<qkv_t>;
@group(0) @binding(2) var<storage, read> k: array<qkv_t>;
@group(0) @binding(3) var<storage, read> v: array<qkv_t>;
@group(0) @binding(4) var<storage, read> mask: array<u32>;   // bool as 0/1, or f32 bits
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> partials: array<f32>;   // [row, split, (m, l, acc)]

const DV: u32 = G * VEC;            // vec4s in one padded head row
const THREADS: u32 = BR * G;
// EXCLUDED: a finite stand-in for -inf (e^(EXCLUDED - m) never makes inf - inf); BAD: a NaN or
// +inf score's stand-in (the row's max says the row is NaN)
const EXCLUDED: f32 = -1.0e30;
const BAD: f32 = 3.0e38;

var<workgroup> k_tile: array<vec4<f32>, BC * DV>;
var<workgroup> v_tile: array<vec4<f32>, BC * DV>;
var<workgroup> partial: array<f32, PARTIAL>;   // [key][thread] partial dot products (G > 1)

// The first element of row orow in a tensor with (b, h, l) element strides st.
fn row_at(orow: u32, st: vec4<u32>) -> u32 {
    let bh = orow / p.l;
    return (bh / p.hq) * st.x + (bh % p.hq) * st.y + (orow % p.l) * st.z;
}

// The first element of work item w's (batch, kv head) in a k or v with (b, h, s) strides st.
fn kv_first(st: vec4<u32>, w: Work) -> u32 {
    return w.b * st.x + w.hk * st.y;
}

// Scaled, biased score; -inf for a bool-masked key (so a NaN score stays NaN, as in torch).
fn biased(dot: f32, b: u32, h: u32, li: u32, sj: u32) -> f32 {
    var s = dot * p.scale;
    if (MASK != 0u) {
        let ms = p.mask_strides;
        let bits = mask[b * ms.x + h * ms.y + li * ms.z + sj * ms.w];
        if (MASK == 1u) {
            s = s + select(0.0, -f32_inf(), bits == 0u);
        } else {
            s = s + bitcast<f32>(bits);
        }
    }
    return s;
}

// A score as the softmax passes take it: EXCLUDED for a key past k_end, above the causal
// diagonal or masked to -inf, BAD for a NaN or +inf score (the row is NaN), else the biased dot.
fn masked_score(dot: f32, sj: u32, k_end: u32, b: u32, h: u32, li: u32) -> f32 {
    var s = EXCLUDED;
    if (sj < k_end && !(CAUSAL && sj > li + p.causal_offset)) {
        let raw = biased(dot, b, h, li, sj);
        s = select(raw, EXCLUDED, is_nan(raw) || raw < EXCLUDED);
        s = select(s, BAD, is_nan(raw) || (is_inf(raw) && raw > 0.0));
    }
    return s;
}

struct Work { b: u32, hk: u32, tile: u32, split: u32 }

// Work item of workgroup wg; a folded grid's spare workgroups get tile >= p.tiles.
fn work_of(wg: u32) -> Work {
    let split = wg % p.splits;
    let rest = wg / p.splits;
    let heads = p.batch * p.hkv;
    // the last row tiles carry the most causal keys: every head's last tile starts first (its
    // splits side by side), then every head's next, so the short ones fill the tail
    let tile = p.tiles - 1u - rest / heads;
    return Work((rest % heads) / p.hkv, rest % p.hkv, tile, split);
}

@compute @workgroup_size(THREADS)
fn flash(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) t: u32) {
    let w = work_of(wg_linear(wid, nwg));
    if (w.tile >= p.tiles) {
        return;
    }
    let r = t / G;
    let g = t % G;
    let rows = p.n_rep * p.l;
    let row = w.tile * BR + r;
    let live = row < rows;
    let own = min(row, rows - 1u);   // rows past the end load a real row's q and drop it
    let li = own / p.n_rep;
    let h = w.hk * p.n_rep + own % p.n_rep;
    let orow = (w.b * p.hq + h) * p.l + li;
    var qv: array<vec4<f32>, VEC>;
    for (var i = 0u; i < VEC; i = i + 1u) {
        qv[i] = load_q(orow, g * VEC + i);
    }
    let k_begin = w.split * p.split_len;
    var k_end = min(p.kv_len, k_begin + p.split_len);
    if (CAUSAL) {
        k_end = min(k_end, (min(rows, w.tile * BR + BR) - 1u) / p.n_rep + 1u + p.causal_offset);
    }
    let kb = kv_first(p.k_strides, w);
    let vb = kv_first(p.v_strides, w);
    var m = EXCLUDED;
    var total = 0.0;
    var bad = false;   // a NaN or +inf score: the row is NaN
    var acc: array<vec4<f32>, VEC>;
    for (var s0 = k_begin; s0 < k_end; s0 = s0 + BC) {
        workgroupBarrier();   // the previous tile's readers are done
        for (var idx = t; idx < BC * DV; idx = idx + THREADS) {
            let sj = s0 + idx / DV;
            var kk = vec4<f32>(0.0);
            var vv = vec4<f32>(0.0);
            if (sj < k_end) {
                kk = load_k(kb + sj * p.k_strides.z, idx % DV);
                vv = load_v(vb + sj * p.v_strides.z, idx % DV);
            }
            k_tile[idx] = kk;
            v_tile[idx] = vv;
        }
        workgroupBarrier();
        // rows past the end (decode fills few of a tile's rows) skip the arithmetic
        var sc: array<f32, BC>;
        if (live) {
            dots(&sc, &qv, g);
        }
        if (G > 1u) {
            if (live) {
                for (var j = 0u; j < BC; j = j + 1u) {
                    partial[j * THREADS + t] = sc[j];
                }
            }
            workgroupBarrier();
            if (live) {
                for (var j = 0u; j < BC; j = j + 1u) {
                    var d = 0.0;
                    for (var gg = 0u; gg < G; gg = gg + 1u) {
                        d = d + partial[j * THREADS + r * G + gg];
                    }
                    sc[j] = d;
                }
            }
        }
        if (live) {
            var tile_max = EXCLUDED;
            for (var j = 0u; j < BC; j = j + 1u) {
                let sj = s0 + j;
                var s = EXCLUDED;
                if (sj < k_end && !(CAUSAL && sj > li + p.causal_offset)) {
                    let raw = biased(sc[j], w.b, h, li, sj);
                    bad = bad || is_nan(raw) || (is_inf(raw) && raw > 0.0);
                    s = select(raw, EXCLUDED, is_nan(raw) || raw < EXCLUDED);
                }
                sc[j] = s;
                tile_max = max(tile_max, s);
            }
            let m_new = max(m, tile_max);
            let rescale = exp(m - m_new);
            var psum = 0.0;
            for (var j = 0u; j < BC; j = j + 1u) {
                let pj = select(exp(sc[j] - m_new), 0.0, sc[j] <= EXCLUDED);
                sc[j] = pj;
                psum = psum + pj;
            }
            total = total * rescale + psum;
            for (var i = 0u; i < VEC; i = i + 1u) {
                var a = acc[i] * rescale;
                for (var j = 0u; j < BC; j = j + 1u) {
                    a = fma(vec4<f32>(sc[j]), v_tile[j * DV + g * VEC + i], a);
                }
                acc[i] = a;
            }
            m = m_new;
        }
    }
    if (!live) {
        return;
    }
    if (p.splits == 1u) {
        write_out(orow, g, &acc, total, bad);
    } else {
        write_partial((orow * p.splits + w.split) * (p.ev + 2u), g, &acc, m, total, bad);
    }
}

// This thread's slice of the tile's dot products q . k_j.
fn dots(sc: ptr<function, array<f32, BC>>, qv: ptr<function, array<vec4<f32>, VEC>>, g: u32) {
    for (var j = 0u; j < BC; j = j + 1u) {
        var d = 0.0;
        for (var i = 0u; i < VEC; i = i + 1u) {
            d = d + dot((*qv)[i], k_tile[j * DV + g * VEC + i]);
        }
        (*sc)[j] = d;
    }
}

fn write_out(orow: u32, g: u32, acc: ptr<function, array<vec4<f32>, VEC>>, total: f32, bad: bool) {
    // a fully masked row (total 0) keeps acc: 0, or the NaN some v brought in
    let inv = select(1.0 / total, 1.0, total == 0.0);
    let at = row_at(orow, p.out_strides);
    for (var i = 0u; i < VEC; i = i + 1u) {
        for (var e = 0u; e < 4u; e = e + 1u) {
            let c = (g * VEC + i) * 4u + e;
            if (c < p.ev) {
                out[at + c] = select((*acc)[i][e] * inv, f32_nan(), bad);
            }
        }
    }
}

fn write_partial(rec: u32, g: u32, acc: ptr<function, array<vec4<f32>, VEC>>, m: f32, total: f32,
                 bad: bool) {
    if (g == 0u) {
        partials[rec] = select(m, f32_nan(), bad);   // a NaN m marks the row NaN
        partials[rec + 1u] = total;
    }
    for (var i = 0u; i < VEC; i = i + 1u) {
        for (var e = 0u; e < 4u; e = e + 1u) {
            let c = (g * VEC + i) * 4u + e;
            if (c < p.ev) {
                partials[rec + 2u + c] = (*acc)[i][e];
            }
        }
    }
}

// Prefill, register-blocked: a workgroup of P_T = (P_BR / 4) x (P_BC / 4) threads owns P_BR
// query rows (Q staged once, transposed) and walks its split's keys (whole tiles) in tiles of
// P_BC, K (transposed) then V staged in one region. Thread (row quad rq, key quad ks) owns rows
// 4rq..4rq+3 throughout, as the 4 components of its vec4s:
//   scores:  S[rows, keys 4ks..4ks+3] += q[:, d] k[d, :]^T over the head dims d, outer products
//            of two vec4 loads (16 independent FMAs per d; dot products made a serial chain
//            of 4 and left the GPU idle), scaled, biased and masked; the block's row maxima to
//            p_red;
//   softmax: every thread of a row quad reads the key quads' maxima, so all hold the same
//            running max m; p = e^(s - m) goes to p_pt [key][row quad] and into the thread's
//            own partial row sums (V is staged meanwhile);
//   values:  acc = acc e^(m_old - m) + P V over columns cg + jj*NKS (cg = ks).
// The partial sums meet once, at the end: the output, or with several splits the rows' (m, l,
// acc) partials. A NaN or +inf score enters the max as BAD, so the row's max says the row is
// NaN. Every register block is named vec4s (Quad, Acc), never an
// indexed array: NVIDIA's compiler put those in local memory (1.85 ms at T = 512 on the H200).
// The prelude defines P_BR, P_BC, P_T and P_OJ (value vec4s per thread and row, 1 to 4).

const RG: u32 = P_BR / 4u;        // row quads
const NKS: u32 = P_BC / 4u;       // key quads of the scores, column groups of the output
const KVR: u32 = P_BC * max(DE4, DV4);   // vec4s of the K^T / V region

var<workgroup> p_q: array<vec4<f32>, P_BR * DE4>;   // [head dim d][row quad]: Q^T
var<workgroup> p_kv: array<vec4<f32>, KVR>;         // [d][key quad]: K^T, then [key][vec4]: V
var<workgroup> p_pt: array<vec4<f32>, P_BC * RG>;   // [key][row quad]: p
var<workgroup> p_red: array<vec4<f32>, P_T>;        // [ks][row quad]: block maxima, then sums

// Four vec4s: a block's keys 4ks+I (components: rows), or one column vec4 of 4 rows (rI: row
// 4rq+I).
struct Quad { r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32> }
// A thread's accumulator: its rows' Quad at column groups c0..c3 (those below P_OJ).
struct Acc { c0: Quad, c1: Quad, c2: Quad, c3: Quad }

fn q_row(w: Work, row: u32) -> vec3<u32> {
    // (output row, position, query head) of workgroup row `row`
    let li = row / p.n_rep;
    let h = w.hk * p.n_rep + row % p.n_rep;
    return vec3<u32>((w.b * p.hq + h) * p.l + li, li, h);
}

@compute @workgroup_size(P_T)
fn prefill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) t: u32) {
    let w = work_of(wg_linear(wid, nwg));
    if (w.tile >= p.tiles) {
        return;
    }
    let rows = p.n_rep * p.l;
    let row0 = w.tile * P_BR;
    let rq = t % RG;
    let ks = t / RG;
    let k_begin = w.split * p.split_len;   // a whole number of key tiles
    var k_end = min(p.kv_len, k_begin + p.split_len);
    if (CAUSAL) {
        k_end = min(k_end, (min(rows, row0 + P_BR) - 1u) / p.n_rep + 1u + p.causal_offset);
    }
    if (k_begin >= k_end) {   // a split above the diagonal: no keys, weight 0 in combine
        prefill_write(w, Acc(), vec4<f32>(EXCLUDED), vec4<f32>(0.0), rq, ks, row0, rows);
        return;
    }
    stage_q(w, t, row0, rows);
    let kb = kv_first(p.k_strides, w);
    let vb = kv_first(p.v_strides, w);
    // the 4 rows' (position, query head), clamped to real rows like their q
    let rows4 = min(vec4<u32>(row0 + 4u * rq) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(rows - 1u));
    let li = rows4 / p.n_rep;
    let hh = vec4<u32>(w.hk * p.n_rep) + rows4 % p.n_rep;
    var m = vec4<f32>(EXCLUDED);
    var total = vec4<f32>(0.0);   // this thread's keys' share of the row sums
    var acc = Acc();
    // a thread's first four loads of each stage are issued a phase ahead (K of the next tile
    // during this tile's values, V during its scores), so their latency hides behind FMAs
    var k_ahead = fetch4(t, k_begin, k_end, kb, false);
    for (var s0 = k_begin; s0 < k_end; s0 = s0 + P_BC) {
        workgroupBarrier();   // the previous tile's p and V readers are done
        stage_rows(t, s0, k_end, kb, false, k_ahead);
        let v_ahead = fetch4(t, s0, k_end, vb, true);
        workgroupBarrier();
        let sc = prefill_scores(w.b, rq, ks, s0, k_end, hh, li);
        p_red[ks * RG + rq] = max(max(sc.r0, sc.r1), max(sc.r2, sc.r3));
        workgroupBarrier();
        stage_rows(t, s0, k_end, vb, true, v_ahead);
        k_ahead = fetch4(t, s0 + P_BC, k_end, kb, false);
        var m_new = m;
        for (var g = 0u; g < NKS; g = g + 1u) {
            m_new = max(m_new, p_red[g * RG + rq]);
        }
        let pq = prefill_probs(sc, m_new, rq, ks);
        let alpha = exp(m - m_new);
        total = total * alpha + pq.r0 + pq.r1 + pq.r2 + pq.r3;
        m = m_new;
        workgroupBarrier();
        acc = prefill_values(acc, alpha, rq, ks);
    }
    workgroupBarrier();   // the last tile's block maxima are read
    p_red[ks * RG + rq] = total;
    workgroupBarrier();
    var l = vec4<f32>(0.0);
    for (var g = 0u; g < NKS; g = g + 1u) {
        l = l + p_red[g * RG + rq];
    }
    prefill_write(w, acc, m, l, rq, ks, row0, rows);
}

// The tile's q rows into Q^T (p_q), in rounds of eight loads in flight before their stores: a
// loop of load-then-store waited out each load in turn (H100, causal T=512 d=64 one pass:
// 117.9 -> 116.1 us at 32/32 heads, 111.2 -> 109.2 at 32/8; bench/results/sdpa_tiles_h100.txt).
// Issuing the next tile's K and V two phases ahead as well lost: 120.9 us.
fn stage_q(w: Work, t: u32, row0: u32, rows: u32) {
    for (var i = t; i < P_BR * DE4; i = i + 8u * P_T) {
        let a = Quad(q_elem(w, i, row0, rows), q_elem(w, i + P_T, row0, rows),
                     q_elem(w, i + 2u * P_T, row0, rows), q_elem(w, i + 3u * P_T, row0, rows));
        let b = Quad(q_elem(w, i + 4u * P_T, row0, rows), q_elem(w, i + 5u * P_T, row0, rows),
                     q_elem(w, i + 6u * P_T, row0, rows), q_elem(w, i + 7u * P_T, row0, rows));
        put_q(i, a.r0);
        put_q(i + P_T, a.r1);
        put_q(i + 2u * P_T, a.r2);
        put_q(i + 3u * P_T, a.r3);
        put_q(i + 4u * P_T, b.r0);
        put_q(i + 5u * P_T, b.r1);
        put_q(i + 6u * P_T, b.r2);
        put_q(i + 7u * P_T, b.r3);
    }
}

// Staged q element i (vec4 i / P_BR of tile row i % P_BR; past the tile, its last): rows past
// the end load a real row's q.
fn q_elem(w: Work, i: u32, row0: u32, rows: u32) -> vec4<f32> {
    let at = min(i, P_BR * DE4 - 1u);
    let own = min(row0 + at % P_BR, rows - 1u);
    return load_q(q_row(w, own).x, at / P_BR);
}

fn put_q(i: u32, x: vec4<f32>) {
    if (i < P_BR * DE4) {
        store_qt(i / P_BR, i % P_BR, x);
    }
}

// x, vec4 c of q row j, into Q^T: element e at [4c + e][j / 4][j % 4]
fn store_qt(c: u32, j: u32, x: vec4<f32>) {
    let at = 4u * c * RG + j / 4u;
    p_q[at][j % 4u] = x.x;
    p_q[at + RG][j % 4u] = x.y;
    p_q[at + 2u * RG][j % 4u] = x.z;
    p_q[at + 3u * RG][j % 4u] = x.w;
}

// Key rows [s0, s0 + P_BC) of K (transposed) or of V into p_kv, zeros past k_end; `base` is
// kv_first of k (of v when is_v), `first` this thread's first round (fetch4 at t), fetched
// ahead. Each round's four loads are issued before any store: a load waits about a
// microsecond on the H200, and a loop of load-then-store waited for each in turn.
fn stage_rows(t: u32, s0: u32, k_end: u32, base: u32, is_v: bool, first: Quad) {
    let n = P_BC * select(DE4, DV4, is_v);
    put4(t, n, is_v, first);
    for (var i = t + 4u * P_T; i < n; i = i + 4u * P_T) {
        put4(i, n, is_v, fetch4(i, s0, k_end, base, is_v));
    }
}

// Staged elements i, i + P_T, i + 2 P_T and i + 3 P_T of the tile at s0 (those past the
// stage repeat its last element, and put4 drops them).
fn fetch4(i: u32, s0: u32, k_end: u32, base: u32, is_v: bool) -> Quad {
    let last = P_BC * select(DE4, DV4, is_v) - 1u;
    return Quad(kv_elem(min(i, last), s0, k_end, base, is_v),
                kv_elem(min(i + P_T, last), s0, k_end, base, is_v),
                kv_elem(min(i + 2u * P_T, last), s0, k_end, base, is_v),
                kv_elem(min(i + 3u * P_T, last), s0, k_end, base, is_v));
}

fn put4(i: u32, n: u32, is_v: bool, x: Quad) {
    stage_store(i, n, is_v, x.r0);
    stage_store(i + P_T, n, is_v, x.r1);
    stage_store(i + 2u * P_T, n, is_v, x.r2);
    stage_store(i + 3u * P_T, n, is_v, x.r3);
}

// (key in the tile, vec4 of its row) of staged element i: K walks keys fastest (its
// transposed stores hit consecutive words), V walks the row (coalesced loads).
fn kv_slot(i: u32, is_v: bool) -> vec2<u32> {
    if (is_v) {
        return vec2<u32>(i / DV4, i % DV4);
    }
    return vec2<u32>(i % P_BC, i / P_BC);
}

// Element i of the staged rows (a clamped real row's load, dropped past k_end: a cache's
// unwritten rows never reach the sums).
fn kv_elem(i: u32, s0: u32, k_end: u32, base: u32, is_v: bool) -> vec4<f32> {
    let at = kv_slot(i, is_v);
    let sj = s0 + at.x;
    let first = base + min(sj, k_end - 1u) * select(p.k_strides.z, p.v_strides.z, is_v);
    var x: vec4<f32>;
    if (is_v) {
        x = load_v(first, at.y);
    } else {
        x = load_k(first, at.y);
    }
    return select(vec4<f32>(0.0), x, sj < k_end);
}

fn stage_store(i: u32, n: u32, is_v: bool, x: vec4<f32>) {
    if (i >= n) {
        return;
    }
    let at = kv_slot(i, is_v);
    if (is_v) {
        p_kv[at.x * DV4 + at.y] = x;
    } else {
        let d = 4u * at.y * NKS + at.x / 4u;
        p_kv[d][at.x % 4u] = x.x;
        p_kv[d + NKS][at.x % 4u] = x.y;
        p_kv[d + 2u * NKS][at.x % 4u] = x.z;
        p_kv[d + 3u * NKS][at.x % 4u] = x.w;
    }
}

// a + q k^T for one head dim: q the 4 rows' values, k the 4 keys'
fn outer4(a: Quad, q: vec4<f32>, k: vec4<f32>) -> Quad {
    return Quad(fma(q, vec4<f32>(k.x), a.r0), fma(q, vec4<f32>(k.y), a.r1),
                fma(q, vec4<f32>(k.z), a.r2), fma(q, vec4<f32>(k.w), a.r3));
}

// This thread's 4 x 4 block of the tile's scores, masked: rJ is key 4ks+J, component I row
// 4rq+I.
fn prefill_scores(b: u32, rq: u32, ks: u32, s0: u32, k_end: u32, hh: vec4<u32>,
                  li: vec4<u32>) -> Quad {
    var a = Quad();
    for (var c = 0u; c < DE4; c = c + 1u) {
        let d = 4u * c;
        a = outer4(a, p_q[d * RG + rq], p_kv[d * NKS + ks]);
        a = outer4(a, p_q[(d + 1u) * RG + rq], p_kv[(d + 1u) * NKS + ks]);
        a = outer4(a, p_q[(d + 2u) * RG + rq], p_kv[(d + 2u) * NKS + ks]);
        a = outer4(a, p_q[(d + 3u) * RG + rq], p_kv[(d + 3u) * NKS + ks]);
    }
    let sj = s0 + 4u * ks;
    return Quad(row_masked(a.r0, sj, k_end, b, hh, li),
                row_masked(a.r1, sj + 1u, k_end, b, hh, li),
                row_masked(a.r2, sj + 2u, k_end, b, hh, li),
                row_masked(a.r3, sj + 3u, k_end, b, hh, li));
}

// key sj's 4 row dots, masked
fn row_masked(d: vec4<f32>, sj: u32, k_end: u32, b: u32, hh: vec4<u32>,
              li: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(masked_score(d.x, sj, k_end, b, hh.x, li.x),
                     masked_score(d.y, sj, k_end, b, hh.y, li.y),
                     masked_score(d.z, sj, k_end, b, hh.z, li.z),
                     masked_score(d.w, sj, k_end, b, hh.w, li.w));
}

fn key_probs(s: vec4<f32>, m: vec4<f32>) -> vec4<f32> {
    return select(exp(s - m), vec4<f32>(0.0), s <= vec4<f32>(EXCLUDED));
}

// p = e^(s - m) of the block into p_pt, and returned for the row sums.
fn prefill_probs(sc: Quad, m: vec4<f32>, rq: u32, ks: u32) -> Quad {
    let pq = Quad(key_probs(sc.r0, m), key_probs(sc.r1, m), key_probs(sc.r2, m),
                  key_probs(sc.r3, m));
    let at = 4u * ks * RG + rq;
    p_pt[at] = pq.r0;
    p_pt[at + RG] = pq.r1;
    p_pt[at + 2u * RG] = pq.r2;
    p_pt[at + 3u * RG] = pq.r3;
    return pq;
}

fn quad_scale(a: Quad, f: vec4<f32>) -> Quad {
    return Quad(a.r0 * f.x, a.r1 * f.y, a.r2 * f.z, a.r3 * f.w);
}

// a + p_i v for rows i: the P V update of one column vec4
fn quad_fma(a: Quad, p4: vec4<f32>, vv: vec4<f32>) -> Quad {
    return Quad(fma(vec4<f32>(p4.x), vv, a.r0), fma(vec4<f32>(p4.y), vv, a.r1),
                fma(vec4<f32>(p4.z), vv, a.r2), fma(vec4<f32>(p4.w), vv, a.r3));
}

// Rows 4rq..4rq+3 of acc * alpha + P V over this thread's value columns cg + jj*NKS. A column
// past DV4 reads a real one (min) and is never written.
fn prefill_values(acc: Acc, alpha: vec4<f32>, rq: u32, cg: u32) -> Acc {
    var a = acc;
    a.c0 = quad_scale(a.c0, alpha);
    if (P_OJ > 1u) {
        a.c1 = quad_scale(a.c1, alpha);
    }
    if (P_OJ > 2u) {
        a.c2 = quad_scale(a.c2, alpha);
    }
    if (P_OJ > 3u) {
        a.c3 = quad_scale(a.c3, alpha);
    }
    for (var j = 0u; j < P_BC; j = j + 2u) {   // two keys a step: their loads go together
        a = key_values(key_values(a, j, rq, cg), j + 1u, rq, cg);
    }
    return a;
}

// a + p_j v_j over this thread's columns, for key j of the tile
fn key_values(acc: Acc, j: u32, rq: u32, cg: u32) -> Acc {
    var a = acc;
    let p4 = p_pt[j * RG + rq];
    let row = j * DV4;
    a.c0 = quad_fma(a.c0, p4, p_kv[row + min(cg, DV4 - 1u)]);
    if (P_OJ > 1u) {
        a.c1 = quad_fma(a.c1, p4, p_kv[row + min(cg + NKS, DV4 - 1u)]);
    }
    if (P_OJ > 2u) {
        a.c2 = quad_fma(a.c2, p4, p_kv[row + min(cg + 2u * NKS, DV4 - 1u)]);
    }
    if (P_OJ > 3u) {
        a.c3 = quad_fma(a.c3, p4, p_kv[row + min(cg + 3u * NKS, DV4 - 1u)]);
    }
    return a;
}

// The rows' outputs, or their (m, l, acc) partials when the keys are split (store_result);
// m and l are the rows' maxima (>= BAD: a NaN row) and sums.
fn prefill_write(w: Work, acc: Acc, m: vec4<f32>, l: vec4<f32>, rq: u32, cg: u32, row0: u32,
                 rows: u32) {
    write_quad(w, acc.c0, m, l, rq, cg, row0, rows);
    if (P_OJ > 1u) {
        write_quad(w, acc.c1, m, l, rq, cg + NKS, row0, rows);
    }
    if (P_OJ > 2u) {
        write_quad(w, acc.c2, m, l, rq, cg + 2u * NKS, row0, rows);
    }
    if (P_OJ > 3u) {
        write_quad(w, acc.c3, m, l, rq, cg + 3u * NKS, row0, rows);
    }
}

// Column vec4 c of rows 4rq..4rq+3 (those below `rows`).
fn write_quad(w: Work, a: Quad, m: vec4<f32>, l: vec4<f32>, rq: u32, c: u32, row0: u32,
              rows: u32) {
    if (c < DV4) {
        let r = row0 + rq * 4u;
        store_result(w, c, r < rows, q_row(w, r).x, m.x, l.x, a.r0);
        store_result(w, c, r + 1u < rows, q_row(w, r + 1u).x, m.y, l.y, a.r1);
        store_result(w, c, r + 2u < rows, q_row(w, r + 2u).x, m.z, l.z, a.r2);
        store_result(w, c, r + 3u < rows, q_row(w, r + 3u).x, m.w, l.w, a.r3);
    }
}

// Decode (few query rows, many keys): a workgroup owns RB rows of one (batch, kv head) and
// one split of the keys, and walks them in chunks of CHUNK keys, one key per thread:
//   scores:  thread j dots key s0 + j with the RB query rows staged in workgroup memory;
//   softmax: a workgroup tree gives each row's chunk max, all threads rescale alike;
//   values:  thread (column c, key group kg) accumulates p[r][j] v_j[c] over its group's keys,
//            coalesced along the value row; the KG groups meet in workgroup memory at the end.
// A NaN or +inf score enters the max as BAD, so the row's max says the row is NaN. The rest
// (masks, causal keys, NaN v, fully masked rows, the partials) is as `flash`.
// The prelude defines RB, DE4 and DV4 (vec4s of a q and a v row), CW (column slots, >= DV4),
// KG (key groups, KG * CW == CHUNK) and CHUNK (threads, keys per chunk).

const KPG: u32 = CHUNK / KG;   // keys per key group
// vec4s of a key row and keys of a group's values a thread loads ahead of a chunk's barriers
const K_AHEAD: u32 = min(16u, 8u * ((DE4 + 7u) / 8u));
const V_AHEAD: u32 = max(4u, min(KPG, 16u));
alias Quad4 = Acc;   // four Quads: 16 consecutive vec4s of a row, or 16 keys' values

// The RB = 4 rows live side by side in vec4s (component r: row r), and the accumulators are
// named (Quad), never indexed arrays, which NVIDIA's compiler put in local memory.
var<workgroup> d_q: array<vec4<f32>, RB * DE4>;       // [row][vec4 of the head dims]
var<workgroup> d_p: array<vec4<f32>, CHUNK>;          // [key]: the rows' scores, then p
var<workgroup> d_red: array<vec4<f32>, CHUNK>;        // [key]: the max tree
var<workgroup> d_acc: array<vec4<f32>, RB * CHUNK>;   // [kg][row][column slot] at the end
var<workgroup> d_l: array<vec4<f32>, KG>;             // [kg]: the rows' sums at the end

@compute @workgroup_size(CHUNK)
fn decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) t: u32) {
    let w = work_of(wg_linear(wid, nwg));
    if (w.tile >= p.tiles || w.split >= live_splits()) {
        return;   // past the live keys: combine reads no partial of this split
    }
    let rows = p.n_rep * p.l;
    // rows past the end repeat a real row
    let own = min(vec4<u32>(w.tile * RB) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(rows - 1u));
    let li = own / p.n_rep;
    let hh = vec4<u32>(w.hk * p.n_rep) + own % p.n_rep;
    let orow = (vec4<u32>(w.b * p.hq) + hh) * p.l + li;
    for (var i = t; i < RB * DE4; i = i + CHUNK) {
        d_q[i] = load_q(orow[i / DE4], i % DE4);
    }
    let k_begin = w.split * p.split_len;
    var k_end = min(p.kv_len, k_begin + p.split_len);
    if (CAUSAL) {
        k_end = min(k_end, li.w + 1u + p.causal_offset);
    }
    let kb = kv_first(p.k_strides, w);
    let vb = kv_first(p.v_strides, w);
    let c = t % CW;
    let kg = t / CW;
    var m = vec4<f32>(EXCLUDED);
    var total = vec4<f32>(0.0);
    var acc = Quad();
    for (var s0 = k_begin; s0 < k_end; s0 = s0 + CHUNK) {
        // the chunk's key row and the first V_AHEAD values of the thread's key group are
        // loaded before any barrier: they wait on memory together (with q on the first
        // chunk), not one phase after another
        let g0 = s0 + kg * KPG;
        let last = min(g0 + KPG, k_end);
        let kr = decode_k(s0 + t, k_end, kb);
        let va = v_ahead(vb, g0, last, c);
        workgroupBarrier();   // q staged; the previous chunk's p readers are done
        decode_scores(s0 + t, t, k_end, kb, w.b, hh, li, kr);
        workgroupBarrier();
        for (var half = CHUNK / 2u; half > 0u; half = half / 2u) {
            if (t < half) {
                d_red[t] = max(d_red[t], d_red[t + half]);
            }
            workgroupBarrier();
        }
        let m_new = max(m, d_red[0]);
        let s = d_p[t];
        d_p[t] = select(exp(s - m_new), vec4<f32>(0.0), s <= vec4<f32>(EXCLUDED));
        workgroupBarrier();
        let rescale = exp(m - m_new);
        acc = quad_scale(acc, rescale);
        total = total * rescale;
        m = m_new;
        if (c < DV4) {
            acc = pv_ahead(acc, &total, g0, last, va);
            for (var jj = V_AHEAD; jj < KPG; jj = jj + 4u) {
                let j = g0 + jj;   // keys j .. j+3 of this group, loads in flight
                acc = pv_quad(acc, &total, j, last, v_quad(vb, j, last, c));
            }
        }
    }
    decode_finish(w, c, kg, rows, orow, m, total, acc);
}

// The 4 staged rows' dots with vec4 c of a key (0 past DE4, whatever the q rows hold).
fn row_dots(c: u32, kk: vec4<f32>) -> vec4<f32> {
    let i = min(c, DE4 - 1u);
    let d = vec4<f32>(dot(d_q[i], kk), dot(d_q[DE4 + i], kk), dot(d_q[2u * DE4 + i], kk),
                      dot(d_q[3u * DE4 + i], kk));
    return select(vec4<f32>(0.0), d, c < DE4);
}

// The first K_AHEAD vec4s of key sj's row (of row k_end - 1 past it; unused there), kb kv_first
// of k: loaded ahead of the chunk's first barrier.
fn decode_k(sj: u32, k_end: u32, kb: u32) -> Quad4 {
    let first = kb + min(sj, k_end - 1u) * p.k_strides.z;
    var r: Quad4;
    r.c0 = k_quad(first, 0u);
    if (K_AHEAD > 4u) {
        r.c1 = k_quad(first, 4u);
    }
    if (K_AHEAD > 8u) {
        r.c2 = k_quad(first, 8u);
        r.c3 = k_quad(first, 12u);
    }
    return r;
}

fn k_quad(first: u32, i: u32) -> Quad {
    return Quad(load_k(first, i), load_k(first, i + 1u), load_k(first, i + 2u),
                load_k(first, i + 3u));
}

// The staged rows' dots with vec4s i .. i+3 of a key
fn quad_dots(sc: vec4<f32>, i: u32, k: Quad) -> vec4<f32> {
    return sc + row_dots(i, k.r0) + row_dots(i + 1u, k.r1) + row_dots(i + 2u, k.r2)
           + row_dots(i + 3u, k.r3);
}

// Key sj's (thread t's) scores against the 4 staged rows, masked, into d_p and d_red; kb is
// kv_first of k, kr the row's first vec4s (decode_k). The sums run in steps of eight vec4s
// (each a chain of eight dots: sc + d0 + .. + d7), the later ones with eight loads in flight.
fn decode_scores(sj: u32, t: u32, k_end: u32, kb: u32, b: u32, hh: vec4<u32>,
                 li: vec4<u32>, kr: Quad4) {
    var sc = vec4<f32>(0.0);
    if (sj < k_end) {
        sc = quad_dots(quad_dots(sc, 0u, kr.c0), 4u, kr.c1);
        if (K_AHEAD > 8u) {
            sc = quad_dots(quad_dots(sc, 8u, kr.c2), 12u, kr.c3);
        }
        let first = kb + sj * p.k_strides.z;
        for (var i = K_AHEAD; i < DE4; i = i + 8u) {
            let ka = k_quad(first, i);
            let kc = k_quad(first, i + 4u);
            sc = quad_dots(quad_dots(sc, i, ka), i + 4u, kc);
        }
    }
    let s = vec4<f32>(masked_score(sc.x, sj, k_end, b, hh.x, li.x),
                      masked_score(sc.y, sj, k_end, b, hh.y, li.y),
                      masked_score(sc.z, sj, k_end, b, hh.z, li.z),
                      masked_score(sc.w, sj, k_end, b, hh.w, li.w));
    d_p[t] = s;
    d_red[t] = s;
}

// Column slot c of key sj's v row (vb: kv_first of v); zeros from `last` (the group's end or
// k_end) on, where no row is read (a cache's unwritten rows may hold anything). A slot past
// DV4 reads the last real one and is never used.
fn decode_v(vb: u32, sj: u32, last: u32, c: u32) -> vec4<f32> {
    let v = load_v(vb + min(sj, last - 1u) * p.v_strides.z, min(c, DV4 - 1u));
    return select(vec4<f32>(0.0), v, sj < last);
}

fn v_quad(vb: u32, j: u32, last: u32, c: u32) -> Quad {
    return Quad(decode_v(vb, j, last, c), decode_v(vb, j + 1u, last, c),
                decode_v(vb, j + 2u, last, c), decode_v(vb, j + 3u, last, c));
}

// The first V_AHEAD keys' values of the group at j (column slot c)
fn v_ahead(vb: u32, j: u32, last: u32, c: u32) -> Quad4 {
    var r: Quad4;
    r.c0 = v_quad(vb, j, last, c);
    if (V_AHEAD > 4u) {
        r.c1 = v_quad(vb, j + 4u, last, c);
    }
    if (V_AHEAD > 8u) {
        r.c2 = v_quad(vb, j + 8u, last, c);
        r.c3 = v_quad(vb, j + 12u, last, c);
    }
    return r;
}

// acc + p_sj v_sj for the 4 rows, and the rows' sums, for a key below `last`.
fn decode_pv(acc: Quad, total: ptr<function, vec4<f32>>, sj: u32, last: u32,
             vv: vec4<f32>) -> Quad {
    if (sj >= last) {
        return acc;
    }
    let pj = d_p[sj % CHUNK];
    *total = *total + pj;
    return quad_fma(acc, pj, vv);
}

// acc + p v over keys j .. j+3 in order (those below `last`)
fn pv_quad(acc: Quad, total: ptr<function, vec4<f32>>, j: u32, last: u32, v: Quad) -> Quad {
    var a = decode_pv(acc, total, j, last, v.r0);
    a = decode_pv(a, total, j + 1u, last, v.r1);
    a = decode_pv(a, total, j + 2u, last, v.r2);
    return decode_pv(a, total, j + 3u, last, v.r3);
}

fn pv_ahead(acc: Quad, total: ptr<function, vec4<f32>>, j: u32, last: u32, v: Quad4) -> Quad {
    var a = pv_quad(acc, total, j, last, v.c0);
    if (V_AHEAD > 4u) {
        a = pv_quad(a, total, j + 4u, last, v.c1);
    }
    if (V_AHEAD > 8u) {
        a = pv_quad(a, total, j + 8u, last, v.c2);
        a = pv_quad(a, total, j + 12u, last, v.c3);
    }
    return a;
}

// The key groups' accumulators and sums meet; key group 0 writes each live row's output, or
// its (m, l, acc) partial when the keys are split.
fn decode_finish(w: Work, c: u32, kg: u32, rows: u32, orow: vec4<u32>, m: vec4<f32>,
                 total: vec4<f32>, acc: Quad) {
    let at = kg * RB * CW + c;
    d_acc[at] = acc.r0;
    d_acc[at + CW] = acc.r1;
    d_acc[at + 2u * CW] = acc.r2;
    d_acc[at + 3u * CW] = acc.r3;
    if (c == 0u) {
        d_l[kg] = total;
    }
    workgroupBarrier();
    if (kg != 0u || c >= DV4) {
        return;
    }
    var a = Quad();
    var l = vec4<f32>(0.0);
    for (var g = 0u; g < KG; g = g + 1u) {
        let i = g * RB * CW + c;
        a = Quad(a.r0 + d_acc[i], a.r1 + d_acc[i + CW], a.r2 + d_acc[i + 2u * CW],
                 a.r3 + d_acc[i + 3u * CW]);
        l = l + d_l[g];
    }
    let r0 = w.tile * RB;
    store_result(w, c, r0 < rows, orow.x, m.x, l.x, a.r0);
    store_result(w, c, r0 + 1u < rows, orow.y, m.y, l.y, a.r1);
    store_result(w, c, r0 + 2u < rows, orow.z, m.z, l.z, a.r2);
    store_result(w, c, r0 + 3u < rows, orow.w, m.w, l.w, a.r3);
}

// One live row's column slot c (decode and prefill): the output normalised by l (one split), or
// its (m, l, acc) partial, column slot 0 writing m and l.
fn store_result(w: Work, c: u32, live: bool, orow: u32, m: f32, l: f32, a: vec4<f32>) {
    if (!live) {
        return;
    }
    let bad = m >= BAD;
    if (p.splits == 1u) {
        // a fully masked row (l 0) keeps acc: 0, or the NaN some v brought in
        let o = select(a * select(1.0 / l, 1.0, l == 0.0), vec4<f32>(f32_nan()), bad);
        store_row(true, row_at(orow, p.out_strides), c, o);
    } else {
        let rec = (orow * p.splits + w.split) * (p.ev + 2u);
        if (c == 0u) {
            partials[rec] = select(m, f32_nan(), bad);   // a NaN m marks the row NaN
            partials[rec + 1u] = l;
        }
        store_row(false, rec + 2u, c, a);
    }
}

// Column slot c of a row: into `out` or, when not `to_out`, into `partials`.
fn store_row(to_out: bool, base: u32, c: u32, v: vec4<f32>) {
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (c * 4u + e < p.ev) {
            if (to_out) {
                out[base + c * 4u + e] = v[e];
            } else {
                partials[base + c * 4u + e] = v[e];
            }
        }
    }
}

// One 64-lane workgroup per output row merges its splits (at most 64, one per lane):
//   M = max_s m_s,  out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
// Lane s loads split s's (m, l); the max and the sum are workgroup trees, the weights wait in
// c_w, and a lane's column loads 16 splits at a time (the first 16 with (m, l)), so no lane
// walks the splits' records one dependent load after another.
const COMBINE_LANES: u32 = 64u;

// The splits that hold live keys: decode splits the cache's whole range (kernels_wgsl/
// attention.py), and those past kv_len neither run nor weigh; at least split 0, which
// writes a row's partial even when no key is live.
fn live_splits() -> u32 {
    return clamp((p.kv_len + p.split_len - 1u) / max(p.split_len, 1u), 1u, p.splits);
}

var<workgroup> c_w: array<f32, COMBINE_LANES>;     // e^(m_s - M) per split
var<workgroup> c_red: array<f32, COMBINE_LANES>;

fn combine_tree(t: u32, take_max: bool) -> f32 {
    for (var half = COMBINE_LANES / 2u; half > 0u; half = half / 2u) {
        workgroupBarrier();
        if (t < half) {
            let a = c_red[t];
            let b = c_red[t + half];
            c_red[t] = select(a + b, max(a, b), take_max);
        }
    }
    workgroupBarrier();
    return c_red[0];
}

@compute @workgroup_size(COMBINE_LANES)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) t: u32) {
    let orow = wg_linear(wid, nwg);
    if (orow >= p.batch * p.hq * p.l) {
        return;   // a whole workgroup: uniform
    }
    let stride = p.ev + 2u;
    let base = orow * p.splits * stride;
    let splits = live_splits();
    var ms = EXCLUDED;
    var ls = 0.0;
    if (t < splits) {
        ms = partials[base + t * stride];
        ls = partials[base + t * stride + 1u];
    }
    // the first column's first 16 splits load with (m, l), ahead of the trees' barriers
    let ahead = partial_cols(base, stride, 0u, min(t, p.ev - 1u), splits);
    ms = select(ms, BAD, is_nan(ms));   // a NaN m marks its row NaN
    c_red[t] = ms;
    let mx = combine_tree(t, true);
    let wt = select(0.0, exp(ms - mx), t < splits);
    workgroupBarrier();   // c_red[0] is read
    c_w[t] = wt;
    c_red[t] = wt * ls;
    let total = combine_tree(t, false);
    let inv = select(1.0 / total, 1.0, total == 0.0);
    let at = row_at(orow, p.out_strides);
    for (var c = t; c < p.ev; c = c + COMBINE_LANES) {
        var x = ahead;
        if (c != t) {
            x = partial_cols(base, stride, 0u, c, splits);
        }
        var a = combine_cols(0.0, 0u, x, splits);
        for (var sp = 16u; sp < splits; sp = sp + 16u) {
            a = combine_cols(a, sp, partial_cols(base, stride, sp, c, splits), splits);
        }
        out[at + c] = select(a * inv, f32_nan(), mx >= BAD);
    }
}

// Column c of splits sp .. sp + 15 (clamped to the last live one), their loads in flight
// together
fn partial_cols(base: u32, stride: u32, sp: u32, c: u32, splits: u32) -> Quad {
    return Quad(partial_col4(base, stride, sp, c, splits),
                partial_col4(base, stride, sp + 4u, c, splits),
                partial_col4(base, stride, sp + 8u, c, splits),
                partial_col4(base, stride, sp + 12u, c, splits));
}

fn partial_col4(base: u32, stride: u32, sp: u32, c: u32, splits: u32) -> vec4<f32> {
    let last = splits - 1u;
    let at = base + 2u + c;
    return vec4<f32>(partials[at + min(sp, last) * stride],
                     partials[at + min(sp + 1u, last) * stride],
                     partials[at + min(sp + 2u, last) * stride],
                     partials[at + min(sp + 3u, last) * stride]);
}

// a + the weighted partials of splits sp .. sp + 15 (those below `splits`), in order
fn combine_cols(a: f32, sp: u32, x: Quad, splits: u32) -> f32 {
    return combine4(combine4(combine4(combine4(a, sp, x.r0, splits), sp + 4u, x.r1, splits),
                             sp + 8u, x.r2, splits), sp + 12u, x.r3, splits);
}

fn combine4(a: f32, sp: u32, x: vec4<f32>, splits: u32) -> f32 {
    if (sp >= splits) {
        return a;
    }
    var r = fma(c_w[sp], x.x, a);
    r = select(r, fma(c_w[min(sp + 1u, COMBINE_LANES - 1u)], x.y, r), sp + 1u < splits);
    r = select(r, fma(c_w[min(sp + 2u, COMBINE_LANES - 1u)], x.z, r), sp + 2u < splits);
    return select(r, fma(c_w[min(sp + 3u, COMBINE_LANES - 1u)], x.w, r), sp + 3u < splits);
}

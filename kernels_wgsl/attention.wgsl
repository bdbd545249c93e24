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
// the first kv_len keys exist (the filled part of a cache); s is the keys' row stride.
// Splits (flash-decoding): with p.splits > 1 the key range is cut into p.split_len slices, one
// workgroup each, which write (m, l, acc) rows to `partials`; `combine` merges them.
// NaN/Inf follow torch's eager CPU SDPA: a NaN or +inf score (NaN q/k, +inf mask) makes its
// row NaN; a NaN v_j reaches every row whose tile holds key j (p_j * NaN, even for p_j = 0);
// a fully masked row gives 0.
// The prelude (attention.py) defines the tile: G, VEC, BR, BC and PARTIAL (1 when G == 1).

override MASK: u32 = 0u;
override CAUSAL: bool = false;

struct SdpaParams {
    batch: u32, hq: u32, hkv: u32, l: u32,
    s: u32, e: u32, ev: u32, n_rep: u32,
    scale: f32, tiles: u32, splits: u32, split_len: u32,
    kv_len: u32, causal_offset: u32, pad0: u32, pad1: u32,
    mask_strides: vec4<u32>,   // (b, h, l, s) element strides of the mask broadcast to scores
}

@group(0) @binding(0) var<uniform> p: SdpaParams;
// q, k and v are vec4 arrays when both head dims are multiples of 4, else f32 arrays: the
// prelude's qkv_t, and its load_q/k/v(row, vec4 index) reading zeros past the head dims
@group(0) @binding(1) var<storage, read> q: array<qkv_t>;
@group(0) @binding(2) var<storage, read> k: array<qkv_t>;
@group(0) @binding(3) var<storage, read> v: array<qkv_t>;
@group(0) @binding(4) var<storage, read> mask: array<u32>;   // bool as 0/1, or f32 bits
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> partials: array<f32>;   // [row, split, (m, l, acc)]

const DV: u32 = G * VEC;            // vec4s in one padded head row
const THREADS: u32 = BR * G;
const EXCLUDED: f32 = -1.0e30;      // finite stand-in for -inf: e^(EXCLUDED - m) never makes inf - inf
const BAD: f32 = 3.0e38;            // a NaN or +inf score's stand-in: the row's max says the row is NaN

var<workgroup> k_tile: array<vec4<f32>, BC * DV>;
var<workgroup> v_tile: array<vec4<f32>, BC * DV>;
var<workgroup> partial: array<f32, PARTIAL>;   // [key][thread] partial dot products (G > 1)

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

struct Work { b: u32, hk: u32, tile: u32, split: u32 }

fn work_of(wg: u32) -> Work {
    let split = wg % p.splits;
    let rest = wg / p.splits;
    // the last row tiles carry the most causal keys: start them first so short ones fill the tail
    let tile = p.tiles - 1u - rest % p.tiles;
    let bh = rest / p.tiles;
    return Work(bh / p.hkv, bh % p.hkv, tile, split);
}

@compute @workgroup_size(THREADS)
fn flash(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) t: u32) {
    let w = work_of(wg_linear(wid, nwg));
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
    let kv_row0 = (w.b * p.hkv + w.hk) * p.s;
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
                kk = load_k(kv_row0 + sj, idx % DV);
                vv = load_v(kv_row0 + sj, idx % DV);
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
    for (var i = 0u; i < VEC; i = i + 1u) {
        for (var e = 0u; e < 4u; e = e + 1u) {
            let c = (g * VEC + i) * 4u + e;
            if (c < p.ev) {
                out[orow * p.ev + c] = select((*acc)[i][e] * inv, f32_nan(), bad);
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

// Prefill, register-blocked: a workgroup of 128 threads owns P_BR query rows (Q staged once)
// and walks the keys in tiles of P_BC, K then V staged in one region. Per tile:
//   scores:  thread (row group rg, key group ks) forms a 4 x P_CS block of S = Q K^T, rows
//            rg + i*RG and keys ks + j*NKS (conflict-free Q reads, broadcast K reads), scaled,
//            biased and masked, into p_pt [key][row];
//   softmax: thread r < P_BR owns row r: its running max, sum and NaN flag, the tile's p and
//            the rescale factor p_alpha[r] (V is staged meanwhile);
//   values:  thread (row quad ro, column group cg) accumulates rows 4ro..4ro+3 of P V over
//            columns cg + jj*NKS.
// The prelude defines P_BR, P_BC, P_CS (keys per thread) and P_OJ (value vec4s per thread).

const PT: u32 = 128u;
const RG: u32 = P_BR / 4u;        // row groups (score rows) and row quads (output rows)
const NKS: u32 = PT / RG;         // key groups of the scores, column groups of the output
const QS: u32 = DE4 + 1u;         // padded row stride of Q and K: conflict-free row reads
const KVS: u32 = max(QS, DV4);

var<workgroup> p_q: array<vec4<f32>, P_BR * QS>;
var<workgroup> p_kv: array<vec4<f32>, P_BC * KVS>;
var<workgroup> p_pt: array<vec4<f32>, P_BC * RG>;   // [key][row quad]: scores, then p
var<workgroup> p_alpha: array<f32, P_BR>;           // per row: the tile's rescale, then the sum

fn q_row(w: Work, row: u32) -> vec3<u32> {
    // (output row, position, query head) of workgroup row `row`
    let li = row / p.n_rep;
    let h = w.hk * p.n_rep + row % p.n_rep;
    return vec3<u32>((w.b * p.hq + h) * p.l + li, li, h);
}

@compute @workgroup_size(PT)
fn prefill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) t: u32) {
    let w = work_of(wg_linear(wid, nwg));
    let rows = p.n_rep * p.l;
    let row0 = w.tile * P_BR;
    for (var i = t; i < P_BR * DE4; i = i + PT) {
        let own = min(row0 + i / DE4, rows - 1u);   // rows past the end load a real row's q
        p_q[(i / DE4) * QS + i % DE4] = load_q(q_row(w, own).x, i % DE4);
    }
    var k_end = p.kv_len;
    if (CAUSAL) {
        k_end = min(k_end, (min(rows, row0 + P_BR) - 1u) / p.n_rep + 1u + p.causal_offset);
    }
    let kv_row0 = (w.b * p.hkv + w.hk) * p.s;
    var m = EXCLUDED;
    var total = 0.0;
    var bad = false;
    var acc: array<vec4<f32>, 4u * P_OJ>;
    for (var s0 = 0u; s0 < k_end; s0 = s0 + P_BC) {
        workgroupBarrier();   // the previous tile's p and V readers are done
        for (var i = t; i < P_BC * DE4; i = i + PT) {
            let sj = s0 + i / DE4;
            p_kv[(i / DE4) * KVS + i % DE4] =
                select(vec4<f32>(0.0), load_k(kv_row0 + sj, i % DE4), sj < k_end);
        }
        workgroupBarrier();
        prefill_scores(w, t, s0, k_end, row0, rows);
        workgroupBarrier();
        for (var i = t; i < P_BC * DV4; i = i + PT) {
            let sj = s0 + i / DV4;
            p_kv[(i / DV4) * KVS + i % DV4] =
                select(vec4<f32>(0.0), load_v(kv_row0 + sj, i % DV4), sj < k_end);
        }
        if (t < P_BR) {
            var tile_max = EXCLUDED;
            for (var j = 0u; j < P_BC; j = j + 1u) {
                tile_max = max(tile_max, p_pt[j * RG + t / 4u][t % 4u]);
            }
            bad = bad || tile_max >= BAD;
            let m_new = max(m, tile_max);
            var psum = 0.0;
            for (var j = 0u; j < P_BC; j = j + 1u) {
                let sc = p_pt[j * RG + t / 4u][t % 4u];
                let pj = select(exp(sc - m_new), 0.0, sc <= EXCLUDED);
                p_pt[j * RG + t / 4u][t % 4u] = pj;
                psum = psum + pj;
            }
            p_alpha[t] = exp(m - m_new);
            total = total * p_alpha[t] + psum;
            m = m_new;
        }
        workgroupBarrier();
        prefill_values(&acc, t % RG, t / RG);
    }
    workgroupBarrier();
    if (t < P_BR) {
        p_alpha[t] = select(total, -1.0, bad);   // a sum is never negative: -1 marks a NaN row
    }
    workgroupBarrier();
    prefill_write(w, &acc, t % RG, t / RG, row0, rows);
}

// This thread's 4 x P_CS block of the tile's scores, scaled, biased and masked, into p_pt.
fn prefill_scores(w: Work, t: u32, s0: u32, k_end: u32, row0: u32, rows: u32) {
    let rg = t % RG;
    let ks = t / RG;
    var sc: array<f32, 4u * P_CS>;
    for (var c = 0u; c < DE4; c = c + 1u) {
        var qv: array<vec4<f32>, 4>;
        for (var i = 0u; i < 4u; i = i + 1u) {
            qv[i] = p_q[(rg + i * RG) * QS + c];
        }
        for (var j = 0u; j < P_CS; j = j + 1u) {
            let kk = p_kv[(ks + j * NKS) * KVS + c];
            for (var i = 0u; i < 4u; i = i + 1u) {
                sc[i * P_CS + j] = sc[i * P_CS + j] + dot(qv[i], kk);
            }
        }
    }
    for (var i = 0u; i < 4u; i = i + 1u) {
        let r = rg + i * RG;
        let at = q_row(w, min(row0 + r, rows - 1u));
        for (var j = 0u; j < P_CS; j = j + 1u) {
            let kj = ks + j * NKS;
            let sj = s0 + kj;
            var s = EXCLUDED;
            if (sj < k_end && !(CAUSAL && sj > at.y + p.causal_offset)) {
                let raw = biased(sc[i * P_CS + j], w.b, at.z, at.y, sj);
                s = select(raw, EXCLUDED, is_nan(raw) || raw < EXCLUDED);
                s = select(s, BAD, is_nan(raw) || (is_inf(raw) && raw > 0.0));
            }
            p_pt[kj * RG + r / 4u][r % 4u] = s;
        }
    }
}

// Rows 4ro..4ro+3 of acc = acc * alpha + P V over this thread's value columns.
fn prefill_values(acc: ptr<function, array<vec4<f32>, 4u * P_OJ>>, ro: u32, cg: u32) {
    for (var i = 0u; i < 4u; i = i + 1u) {
        let alpha = p_alpha[ro * 4u + i];
        for (var jj = 0u; jj < P_OJ; jj = jj + 1u) {
            (*acc)[i * P_OJ + jj] = (*acc)[i * P_OJ + jj] * alpha;
        }
    }
    for (var j = 0u; j < P_BC; j = j + 1u) {
        let p4 = p_pt[j * RG + ro];
        for (var jj = 0u; jj < P_OJ; jj = jj + 1u) {
            let c = cg + jj * NKS;
            if (c < DV4) {
                let vv = p_kv[j * KVS + c];
                for (var i = 0u; i < 4u; i = i + 1u) {
                    (*acc)[i * P_OJ + jj] = fma(vec4<f32>(p4[i]), vv, (*acc)[i * P_OJ + jj]);
                }
            }
        }
    }
}

fn prefill_write(w: Work, acc: ptr<function, array<vec4<f32>, 4u * P_OJ>>, ro: u32, cg: u32,
                 row0: u32, rows: u32) {
    for (var i = 0u; i < 4u; i = i + 1u) {
        let r = ro * 4u + i;
        if (row0 + r >= rows) {
            return;
        }
        let l = p_alpha[r];
        let inv = select(1.0 / l, 1.0, l == 0.0);   // a fully masked row keeps acc (0 or NaN)
        let orow = q_row(w, row0 + r).x;
        for (var jj = 0u; jj < P_OJ; jj = jj + 1u) {
            let c = cg + jj * NKS;
            if (c < DV4) {
                let o = select((*acc)[i * P_OJ + jj] * inv, vec4<f32>(f32_nan()), l < 0.0);
                store_row(true, orow * p.ev, c, o);
            }
        }
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

var<workgroup> d_q: array<vec4<f32>, RB * DE4>;
var<workgroup> d_p: array<f32, RB * CHUNK>;      // [row][key]: scores, then p
var<workgroup> d_red: array<f32, RB * CHUNK>;    // [row][key]: the max tree
var<workgroup> d_acc: array<vec4<f32>, RB * CHUNK>;   // [kg][row][column slot] at the end
var<workgroup> d_l: array<f32, RB * KG>;

@compute @workgroup_size(CHUNK)
fn decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) t: u32) {
    let w = work_of(wg_linear(wid, nwg));
    let rows = p.n_rep * p.l;
    var orow: array<u32, RB>;
    var li: array<u32, RB>;
    var hh: array<u32, RB>;
    for (var r = 0u; r < RB; r = r + 1u) {
        let own = min(w.tile * RB + r, rows - 1u);   // rows past the end repeat a real row
        li[r] = own / p.n_rep;
        hh[r] = w.hk * p.n_rep + own % p.n_rep;
        orow[r] = (w.b * p.hq + hh[r]) * p.l + li[r];
    }
    for (var i = t; i < RB * DE4; i = i + CHUNK) {
        d_q[i] = load_q(orow[i / DE4], i % DE4);
    }
    let k_begin = w.split * p.split_len;
    var k_end = min(p.kv_len, k_begin + p.split_len);
    if (CAUSAL) {
        k_end = min(k_end, li[RB - 1u] + 1u + p.causal_offset);
    }
    let kv_row0 = (w.b * p.hkv + w.hk) * p.s;
    let c = t % CW;
    let kg = t / CW;
    var m: array<f32, RB>;
    var total: array<f32, RB>;
    var acc: array<vec4<f32>, RB>;
    for (var r = 0u; r < RB; r = r + 1u) {
        m[r] = EXCLUDED;
    }
    for (var s0 = k_begin; s0 < k_end; s0 = s0 + CHUNK) {
        workgroupBarrier();   // q staged; the previous chunk's p readers are done
        decode_scores(s0 + t, k_end, kv_row0, w.b, &hh, &li);
        workgroupBarrier();
        for (var half = CHUNK / 2u; half > 0u; half = half / 2u) {
            decode_max_step(t, half);
            workgroupBarrier();
        }
        var m_new: array<f32, RB>;
        for (var r = 0u; r < RB; r = r + 1u) {
            m_new[r] = max(m[r], d_red[r * CHUNK]);
        }
        decode_exps(t, &m_new);
        workgroupBarrier();
        for (var r = 0u; r < RB; r = r + 1u) {
            let rescale = exp(m[r] - m_new[r]);
            acc[r] = acc[r] * rescale;
            total[r] = total[r] * rescale;
            m[r] = m_new[r];
        }
        if (c < DV4) {
            for (var jj = 0u; jj < KPG; jj = jj + 1u) {
                let j = kg * KPG + jj;
                if (s0 + j < k_end) {
                    let vv = load_v(kv_row0 + s0 + j, c);
                    for (var r = 0u; r < RB; r = r + 1u) {
                        let pj = d_p[r * CHUNK + j];
                        acc[r] = fma(vec4<f32>(pj), vv, acc[r]);
                        total[r] = total[r] + pj;
                    }
                }
            }
        }
    }
    decode_finish(w, t, c, kg, rows, &orow, &m, &total, &acc);
}

// Thread t's key: its score against each staged row, biased and causal-masked, into d_p.
fn decode_scores(sj: u32, k_end: u32, kv_row0: u32, b: u32, hh: ptr<function, array<u32, RB>>,
                 li: ptr<function, array<u32, RB>>) {
    let j = sj % CHUNK;
    var sc: array<f32, RB>;
    if (sj < k_end) {
        for (var i = 0u; i < DE4; i = i + 1u) {
            let kk = load_k(kv_row0 + sj, i);
            for (var r = 0u; r < RB; r = r + 1u) {
                sc[r] = sc[r] + dot(d_q[r * DE4 + i], kk);
            }
        }
    }
    for (var r = 0u; r < RB; r = r + 1u) {
        var s = EXCLUDED;
        if (sj < k_end && !(CAUSAL && sj > (*li)[r] + p.causal_offset)) {
            let raw = biased(sc[r], b, (*hh)[r], (*li)[r], sj);
            s = select(raw, EXCLUDED, is_nan(raw) || raw < EXCLUDED);
            s = select(s, BAD, is_nan(raw) || (is_inf(raw) && raw > 0.0));
        }
        d_p[r * CHUNK + j] = s;
        d_red[r * CHUNK + j] = s;
    }
}

// One level of each row's max tree over the chunk's scores, in d_red.
fn decode_max_step(t: u32, half: u32) {
    if (t < half) {
        for (var r = 0u; r < RB; r = r + 1u) {
            let i = r * CHUNK + t;
            d_red[i] = max(d_red[i], d_red[i + half]);
        }
    }
}

// p = e^(s - m) into d_p, 0 for an excluded key.
fn decode_exps(t: u32, m_new: ptr<function, array<f32, RB>>) {
    for (var r = 0u; r < RB; r = r + 1u) {
        let s = d_p[r * CHUNK + t];
        d_p[r * CHUNK + t] = select(exp(s - (*m_new)[r]), 0.0, s <= EXCLUDED);
    }
}

// The key groups' accumulators and sums meet; key group 0 writes each live row's output, or
// its (m, l, acc) partial when the keys are split.
fn decode_finish(w: Work, t: u32, c: u32, kg: u32, rows: u32, orow: ptr<function, array<u32, RB>>,
                 m: ptr<function, array<f32, RB>>, total: ptr<function, array<f32, RB>>,
                 acc: ptr<function, array<vec4<f32>, RB>>) {
    for (var r = 0u; r < RB; r = r + 1u) {
        d_acc[(kg * RB + r) * CW + c] = (*acc)[r];
        if (c == 0u) {
            d_l[kg * RB + r] = (*total)[r];
        }
    }
    workgroupBarrier();
    if (kg != 0u || c >= DV4) {
        return;
    }
    for (var r = 0u; r < RB; r = r + 1u) {
        if (w.tile * RB + r >= rows) {
            break;
        }
        var a = vec4<f32>(0.0);
        var l = 0.0;
        for (var g = 0u; g < KG; g = g + 1u) {
            a = a + d_acc[(g * RB + r) * CW + c];
            l = l + d_l[g * RB + r];
        }
        let bad = (*m)[r] >= BAD;
        if (p.splits == 1u) {
            // a fully masked row (l 0) keeps acc: 0, or the NaN some v brought in
            let o = select(a * select(1.0 / l, 1.0, l == 0.0), vec4<f32>(f32_nan()), bad);
            store_row(true, (*orow)[r] * p.ev, c, o);
        } else {
            let rec = ((*orow)[r] * p.splits + w.split) * (p.ev + 2u);
            if (c == 0u) {
                partials[rec] = select((*m)[r], f32_nan(), bad);   // a NaN m marks the row NaN
                partials[rec + 1u] = l;
            }
            store_row(false, rec + 2u, c, a);
        }
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

// One 64-lane workgroup per output row merges its splits:
//   M = max_s m_s,  out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
@compute @workgroup_size(64)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) t: u32) {
    let orow = wg_linear(wid, nwg);
    if (orow >= p.batch * p.hq * p.l) {
        return;
    }
    let stride = p.ev + 2u;
    let base = orow * p.splits * stride;
    var mx = EXCLUDED;
    var bad = false;
    for (var sp = 0u; sp < p.splits; sp = sp + 1u) {
        let ms = partials[base + sp * stride];
        bad = bad || is_nan(ms);
        mx = max(mx, ms);
    }
    var total = 0.0;
    for (var sp = 0u; sp < p.splits; sp = sp + 1u) {
        total = total + exp(partials[base + sp * stride] - mx) * partials[base + sp * stride + 1u];
    }
    let inv = select(1.0 / total, 1.0, total == 0.0);
    for (var c = t; c < p.ev; c = c + 64u) {
        var a = 0.0;
        for (var sp = 0u; sp < p.splits; sp = sp + 1u) {
            let rec = base + sp * stride;
            a = fma(exp(partials[rec] - mx), partials[rec + 2u + c], a);
        }
        out[orow * p.ev + c] = select(a * inv, f32_nan(), bad);
    }
}

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
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> mask: array<u32>;   // bool as 0/1, or f32 bits
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> partials: array<f32>;   // [row, split, (m, l, acc)]

const DV: u32 = G * VEC;            // vec4s in one padded head row
const THREADS: u32 = BR * G;
const EXCLUDED: f32 = -1.0e30;      // finite stand-in for -inf: e^(EXCLUDED - m) never makes inf - inf

var<workgroup> k_tile: array<vec4<f32>, BC * DV>;
var<workgroup> v_tile: array<vec4<f32>, BC * DV>;
var<workgroup> partial: array<f32, PARTIAL>;   // [key][thread] partial dot products (G > 1)

fn load_q(base: u32, c: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i = i + 1u) {
        if (c + i < p.e) { r[i] = q[base + c + i]; }
    }
    return r;
}

fn load_k(base: u32, c: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i = i + 1u) {
        if (c + i < p.e) { r[i] = k[base + c + i]; }
    }
    return r;
}

fn load_v(base: u32, c: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i = i + 1u) {
        if (c + i < p.ev) { r[i] = v[base + c + i]; }
    }
    return r;
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
        qv[i] = load_q(orow * p.e, (g * VEC + i) * 4u);
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
            let c = (idx % DV) * 4u;
            var kk = vec4<f32>(0.0);
            var vv = vec4<f32>(0.0);
            if (sj < k_end) {
                kk = load_k((kv_row0 + sj) * p.e, c);
                vv = load_v((kv_row0 + sj) * p.ev, c);
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

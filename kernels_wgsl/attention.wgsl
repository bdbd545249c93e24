// Scaled dot-product attention, one 64-lane workgroup per query row (b, h, l), streaming the
// keys in chunks of 64 with an online softmax (running max m, running sum l):
//   s_j = q . k_j * scale + bias_j,   m' = max(m, max_j s_j),
//   l' = l * e^(m - m') + sum_j e^(s_j - m'),   acc' = acc * e^(m - m') + sum_j e^(s_j - m') v_j
//   out = acc / l
// bias: MASK 0 none, 1 bool (false -> excluded), 2 float (added); CAUSAL keeps keys s <= l
// (torch's top-left tril). Query head h reads kv head h / (hq / hkv) (GQA).
// Lane t owns output dims t, t+64, t+128, t+192, so head dims are at most 256.

override MASK: u32 = 0u;
override CAUSAL: bool = false;

struct SdpaParams {
    batch: u32, hq: u32, hkv: u32, l: u32,
    s: u32, e: u32, ev: u32, rows: u32,
    scale: f32, _p0: u32, _p1: u32, _p2: u32,
    mask_strides: vec4<u32>,   // (b, h, l, s) element strides of the mask broadcast to scores
}

@group(0) @binding(0) var<uniform> p: SdpaParams;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> mask: array<u32>;   // bool as 0/1, or f32 bits
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const LANES: u32 = 64u;
const MAX_HEAD: u32 = 256u;
const EXCLUDED: f32 = -1.0e30;   // finite, so a fully masked chunk never makes inf - inf
var<workgroup> q_row: array<f32, MAX_HEAD>;
var<workgroup> probs: array<f32, LANES>;

fn score(b: u32, h: u32, hk: u32, li: u32, si: u32) -> f32 {
    if (si >= p.s || (CAUSAL && si > li)) {
        return EXCLUDED;
    }
    let kb = ((b * p.hkv + hk) * p.s + si) * p.e;
    var dot = 0.0;
    for (var c = 0u; c < p.e; c = c + 1u) {
        dot = fma(q_row[c], k[kb + c], dot);
    }
    var sc = dot * p.scale;
    let mi = b * p.mask_strides.x + h * p.mask_strides.y + li * p.mask_strides.z + si * p.mask_strides.w;
    if (MASK == 1u && mask[mi] == 0u) {
        return EXCLUDED;
    }
    if (MASK == 2u) {
        sc = sc + bitcast<f32>(mask[mi]);
    }
    return max(sc, EXCLUDED);
}

@compute @workgroup_size(64)
fn sdpa(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let row = wg_linear(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let li = row % p.l;
    let h = (row / p.l) % p.hq;
    let b = row / (p.l * p.hq);
    let hk = h / (p.hq / p.hkv);
    for (var c = t; c < p.e; c = c + LANES) {
        q_row[c] = q[row * p.e + c];
    }
    workgroupBarrier();
    var m = EXCLUDED;
    var total = 0.0;
    var acc = vec4<f32>(0.0);
    let vbase = (b * p.hkv + hk) * p.s;
    // Causal rows never look past their own position: stop streaming keys there.
    let s_end = select(p.s, min(p.s, li + 1u), CAUSAL);
    for (var s0 = 0u; s0 < s_end; s0 = s0 + LANES) {
        let sc = score(b, h, hk, li, s0 + t);
        probs[t] = sc;
        workgroupBarrier();
        var cmax = EXCLUDED;
        for (var j = 0u; j < LANES; j = j + 1u) {
            cmax = max(cmax, probs[j]);
        }
        let m_new = max(m, cmax);
        let keep = exp(m - m_new);
        workgroupBarrier();
        probs[t] = select(exp(sc - m_new), 0.0, sc <= EXCLUDED);
        workgroupBarrier();
        var csum = 0.0;
        var cacc = vec4<f32>(0.0);
        let count = min(LANES, p.s - s0);
        for (var j = 0u; j < count; j = j + 1u) {
            let pj = probs[j];
            csum = csum + pj;
            let vrow = (vbase + s0 + j) * p.ev;
            for (var r = 0u; r < 4u; r = r + 1u) {
                let c = t + r * LANES;
                if (c < p.ev) {
                    cacc[r] = fma(pj, v[vrow + c], cacc[r]);
                }
            }
        }
        total = total * keep + csum;
        acc = acc * keep + cacc;
        m = m_new;
        workgroupBarrier();
    }
    for (var r = 0u; r < 4u; r = r + 1u) {
        let c = t + r * LANES;
        if (c < p.ev) {
            out[row * p.ev + c] = acc[r] / total;
        }
    }
}

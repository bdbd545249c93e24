// linear_q4gsw decode (M == 1): cooperative GEMV over 4-bit group-symmetric weights.
//   out[n] = bias[n] + sum_w scales[8w / gs, n] * dot(q[n, 8w .. 8w+7], x[8w .. 8w+7])
// 64 lanes per workgroup, 2 output columns per workgroup. Lane l reads packed words
// w = l, l + 64, ... of both columns' rows (consecutive lanes, consecutive words), unpacks the
// 8 nibbles of each against two vec4<f32> activation loads, and the 64 partial sums meet in a
// workgroup tree reduction. Each loop step issues four independent word loads per column
// (clamped, not branched, so all four are in flight). All math is f32: the kernel is bound by
// the weight reads. (Measured on an H200: one u32 per lane per load beat one vec4<u32> per
// lane by ~1.9x; four loads per step beat one by ~6%.)

override HAS_BIAS: bool = false;

struct Q4Params {
    m: u32, n: u32, k: u32, group_size: u32,
    n_pad: u32, k_words: u32, tiles_m: u32, tiles_n: u32,
}

@group(0) @binding(0) var<uniform> p: Q4Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> packed: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const LANES: u32 = 64u;
const COLS: u32 = 2u;
var<workgroup> partial: array<vec2<f32>, 64>;

// dot(q[8 nibbles of word] - 8, (lo, hi))
fn word_dot(word: u32, lo: vec4<f32>, hi: vec4<f32>) -> f32 {
    let shifts = vec4<u32>(0u, 4u, 8u, 12u);
    let w = vec4<u32>(word);
    let q_lo = vec4<f32>((w >> shifts) & vec4<u32>(0xFu)) - 8.0;
    let q_hi = vec4<f32>((w >> (shifts + 16u)) & vec4<u32>(0xFu)) - 8.0;
    return dot(q_lo, lo) + dot(q_hi, hi);
}

// Both columns' contributions of word w, or 0 past the row's end.
fn word_step(w: u32, row0: u32, row1: u32, n0: u32, n1: u32) -> vec2<f32> {
    let ok = w < p.k_words;
    let wc = select(0u, w, ok);
    let lo = x[2u * wc];
    let hi = x[2u * wc + 1u];
    let g = (8u * wc) / p.group_size * p.n_pad;
    let d = vec2<f32>(word_dot(packed[row0 + wc], lo, hi), word_dot(packed[row1 + wc], lo, hi));
    return select(vec2<f32>(0.0), vec2<f32>(scales[g + n0], scales[g + n1]) * d, ok);
}

@compute @workgroup_size(64)
fn q4gsw_coop_gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lane: u32) {
    let n0 = wg_linear(wid, nwg) * COLS;
    if (n0 >= p.n) {
        return;   // uniform per workgroup
    }
    let n1 = min(n0 + 1u, p.n - 1u);   // an odd last column computes its neighbour twice
    let row0 = n0 * p.k_words;
    let row1 = n1 * p.k_words;
    var acc = vec2<f32>(0.0);
    for (var w0 = lane; w0 < p.k_words; w0 = w0 + 4u * LANES) {
        acc = acc + word_step(w0, row0, row1, n0, n1)
                  + word_step(w0 + LANES, row0, row1, n0, n1)
                  + word_step(w0 + 2u * LANES, row0, row1, n0, n1)
                  + word_step(w0 + 3u * LANES, row0, row1, n0, n1);
    }
    partial[lane] = acc;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s = s / 2u) {
        if (lane < s) {
            partial[lane] = partial[lane] + partial[lane + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u) {
        var r = partial[0];
        if (HAS_BIAS) {
            r = r + vec2<f32>(bias[n0], bias[n1]);
        }
        out[n0] = r.x;
        if (n1 != n0) {
            out[n1] = r.y;
        }
    }
}

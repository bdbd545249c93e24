// Normalizations over the trailing `d` elements of each row, one workgroup per row.
//   rms_norm:   out = x / sqrt(mean(x^2) + eps) * w
//   layer_norm: out = (x - mean) / sqrt(var + eps) * w + b   (two-pass variance)
//
// The prelude (normalization.py) picks the lane type V: vec4<f32> where d % 4 == 0, else f32,
// with LANES its width, total(v) the sum of its components and add_squares(ss, v) ss plus the
// sum of their squares (common.wgsl's add_squares4: explicit fmas). A row is p.d / LANES lanes.
// Each thread keeps its first HELD lanes of the row in registers, loaded back to back before
// any is used: a row of up to WG * HELD * LANES elements (2048 with vec4) is read from memory
// once, as a handful of independent loads per thread. (The f32 loop this replaced issued its
// d / WG loads one after another, and one Llama-sized row took 13-15 µs on an H100, latency
// bound.) Longer rows read the remainder from memory again in each pass.

override HAS_WEIGHT: bool = true;
override HAS_BIAS: bool = true;
override STATS: bool = false;   // layer_norm also writes mean and rstd per row

struct NormParams {
    rows: u32,
    d: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: NormParams;
@group(0) @binding(1) var<storage, read> x: array<V>;
@group(0) @binding(2) var<storage, read> weight: array<V>;
@group(0) @binding(3) var<storage, read> bias: array<V>;
@group(0) @binding(4) var<storage, read_write> out: array<V>;
@group(0) @binding(5) var<storage, read_write> mean_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd_out: array<f32>;

const WG: u32 = 128u;
const HELD: u32 = 4u;
var<workgroup> red: array<f32, WG>;

fn sum_all(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn scaled(v: V, i: u32) -> V {
    var r = v;
    if (HAS_WEIGHT) {
        r = r * weight[i];
    }
    if (HAS_BIAS) {
        r = r + bias[i];
    }
    return r;
}

// The row's lanes lid, lid + WG, .. that the thread holds: all HELD loads issued first.
fn held_lanes(base: u32, n: u32, lid: u32) -> array<V, HELD> {
    var h: array<V, HELD>;
    for (var k = 0u; k < HELD; k = k + 1u) {
        let i = lid + k * WG;
        if (i < n) {
            h[k] = x[base + i];
        }
    }
    return h;
}

@compute @workgroup_size(128)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wg_linear(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let n = p.d / LANES;
    let base = row * n;
    let h = held_lanes(base, n, lid);
    // partial lid sums lanes lid, lid + WG, .. in order; the q4gsw GEMV's fused-norm prologue
    // (q4gsw_prologue_norm.wgsl) recomputes these partials, this tree and r bit for bit
    var ss = 0.0;
    for (var k = 0u; k < HELD; k = k + 1u) {
        if (lid + k * WG < n) {
            ss = add_squares(ss, h[k]);
        }
    }
    for (var i = lid + HELD * WG; i < n; i = i + WG) {
        ss = add_squares(ss, x[base + i]);
    }
    let r = rsqrt_of(sum_all(ss, lid) / f32(p.d) + p.eps);
    for (var k = 0u; k < HELD; k = k + 1u) {
        let i = lid + k * WG;
        if (i < n) {
            out[base + i] = scaled(h[k] * r, i);
        }
    }
    for (var i = lid + HELD * WG; i < n; i = i + WG) {
        out[base + i] = scaled(x[base + i] * r, i);
    }
}

@compute @workgroup_size(128)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wg_linear(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let n = p.d / LANES;
    let base = row * n;
    let h = held_lanes(base, n, lid);
    var s = 0.0;
    for (var k = 0u; k < HELD; k = k + 1u) {
        if (lid + k * WG < n) {
            s = s + total(h[k]);
        }
    }
    for (var i = lid + HELD * WG; i < n; i = i + WG) {
        s = s + total(x[base + i]);
    }
    let mean = sum_all(s, lid) / f32(p.d);
    var v = 0.0;
    for (var k = 0u; k < HELD; k = k + 1u) {
        if (lid + k * WG < n) {
            let c = h[k] - mean;
            v = v + total(c * c);
        }
    }
    for (var i = lid + HELD * WG; i < n; i = i + WG) {
        let c = x[base + i] - mean;
        v = v + total(c * c);
    }
    let var_sum = sum_all(v, lid);
    let rstd = rsqrt_of(var_sum / f32(p.d) + p.eps);
    for (var k = 0u; k < HELD; k = k + 1u) {
        let i = lid + k * WG;
        if (i < n) {
            out[base + i] = scaled((h[k] - mean) * rstd, i);
        }
    }
    for (var i = lid + HELD * WG; i < n; i = i + WG) {
        out[base + i] = scaled((x[base + i] - mean) * rstd, i);
    }
    if (STATS && lid == 0u) {
        // torch's Welford mean of a row holding Inf or NaN is NaN, as the variance is
        mean_out[row] = select(mean, f32_nan(), is_nan(var_sum));
        rstd_out[row] = rstd;
    }
}

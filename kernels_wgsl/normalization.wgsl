// Normalizations over the trailing `d` elements of each row, one workgroup per row.
//   rms_norm:   out = x / sqrt(mean(x^2) + eps) * w
//   layer_norm: out = (x - mean) / sqrt(var + eps) * w + b   (two-pass variance)

override HAS_WEIGHT: bool = true;
override HAS_BIAS: bool = true;
override STATS: bool = false;   // layer_norm also writes mean and rstd per row

struct NormParams {
    rows: u32,
    d: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: NormParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> mean_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd_out: array<f32>;

const WG: u32 = 128u;
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

// 1/sqrt(ms) with IEEE's ends written out (WGSL leaves inverseSqrt of Inf and NaN undefined):
// a row holding Inf gives 0 (so its finite elements give 0, the Inf NaN, as torch), NaN stays.
fn rsqrt_of(ms: f32) -> f32 {
    return keep_nan(select(inverseSqrt(ms), 0.0, is_inf(ms)), ms);
}

fn scaled(v: f32, i: u32) -> f32 {
    var r = v;
    if (HAS_WEIGHT) {
        r = r * weight[i];
    }
    if (HAS_BIAS) {
        r = r + bias[i];
    }
    return r;
}

@compute @workgroup_size(128)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wg_linear(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let base = row * p.d;
    var ss = 0.0;
    for (var i = lid; i < p.d; i = i + WG) {
        ss = ss + x[base + i] * x[base + i];
    }
    let r = rsqrt_of(sum_all(ss, lid) / f32(p.d) + p.eps);
    for (var i = lid; i < p.d; i = i + WG) {
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
    let base = row * p.d;
    var s = 0.0;
    for (var i = lid; i < p.d; i = i + WG) {
        s = s + x[base + i];
    }
    let mean = sum_all(s, lid) / f32(p.d);
    var v = 0.0;
    for (var i = lid; i < p.d; i = i + WG) {
        let c = x[base + i] - mean;
        v = v + c * c;
    }
    let var_sum = sum_all(v, lid);
    let rstd = rsqrt_of(var_sum / f32(p.d) + p.eps);
    for (var i = lid; i < p.d; i = i + WG) {
        out[base + i] = scaled((x[base + i] - mean) * rstd, i);
    }
    if (STATS && lid == 0u) {
        // torch's Welford mean of a row holding Inf or NaN is NaN, as the variance is
        mean_out[row] = select(mean, f32_nan(), is_nan(var_sum));
        rstd_out[row] = rstd;
    }
}

// Inference batch norm over dim 1 of [N, C, inner...], one thread per element:
//   y = (x - mean[c]) * rsqrt(var[c] + eps) * w[c] + b[c],   c = (i / inner) % C

override HAS_WEIGHT: bool = true;
override HAS_BIAS: bool = true;

struct BatchNormParams {
    n: u32,
    c: u32,
    inner: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: BatchNormParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> mean: array<f32>;
@group(0) @binding(5) var<storage, read> variance: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn batch_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 64u + lid;
    if (i >= p.n) { return; }
    let c = (i / p.inner) % p.c;
    // 1 / sqrt, not inverseSqrt: WGSL leaves inverseSqrt's precision looser
    var y = (x[i] - mean[c]) / sqrt(variance[c] + p.eps);
    if (HAS_WEIGHT) {
        y = y * weight[c];
    }
    if (HAS_BIAS) {
        y = y + bias[c];
    }
    out[i] = y;
}

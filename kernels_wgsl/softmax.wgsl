// Softmax along one dim, one workgroup per row. A row is `size` elements `inner` apart:
//   out = exp(x - max) / sum(exp(x - max))

struct SoftmaxParams {
    rows: u32,
    size: u32,
    inner: u32,
}

@group(0) @binding(0) var<uniform> p: SoftmaxParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

const WG: u32 = 128u;
var<workgroup> red: array<f32, WG>;

// Tree reduction over red[]; every thread returns the total (max or sum).
fn reduce(v: f32, lid: u32, is_max: bool) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red[lid] = select(red[lid] + red[lid + s], max(red[lid], red[lid + s]), is_max);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(128)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let row = wg_linear(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let base = (row / p.inner) * p.size * p.inner + row % p.inner;
    // NaN needs no NaN-aware max here: a NaN (or the +Inf - +Inf of a row holding +Inf) reaches
    // the sum through exp(x - m), so the whole row is NaN, as torch gives.
    var m = -3.4028235e38;
    for (var i = lid; i < p.size; i = i + WG) {
        m = max(m, x[base + i * p.inner]);
    }
    m = reduce(m, lid, true);
    var s = 0.0;
    for (var i = lid; i < p.size; i = i + WG) {
        s = s + exp(x[base + i * p.inner] - m);
    }
    s = reduce(s, lid, false);
    for (var i = lid; i < p.size; i = i + WG) {
        out[base + i * p.inner] = exp(x[base + i * p.inner] - m) / s;
    }
}

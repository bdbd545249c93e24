// Reductions over any set of dims, one workgroup per output element. The input splits into
// kept dims (which output element) and reduced dims (which of the `size` terms), each with its
// own shape and input strides, so no transpose runs first:
//   in_offset(o, r) = strided(o; kept) + strided(r; reduced)
// var is two-pass over the row (mean, then squared deviations) for float32 accuracy:
//   var = sum((x - mean)^2) / max(0, N - correction)

struct ReduceParams {
    outs: u32,
    size: u32,
    kept_rank: u32,
    red_rank: u32,
    correction: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    kept_shape: array<vec4<u32>, 2>,
    kept_strides: array<vec4<u32>, 2>,
    red_shape: array<vec4<u32>, 2>,
    red_strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: ReduceParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

const WG: u32 = 128u;
const COMBINE_ADD: u32 = 0u;
const COMBINE_MAX: u32 = 1u;
const COMBINE_MIN: u32 = 2u;
var<workgroup> red: array<f32, WG>;

fn combine(a: f32, b: f32, how: u32) -> f32 {
    switch how {
        case COMBINE_MAX: { return max_nan(a, b); }
        case COMBINE_MIN: { return min_nan(a, b); }
        default: { return a + b; }
    }
}

// Tree reduction over red[]; every thread returns the total.
fn tree(v: f32, lid: u32, how: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red[lid] = combine(red[lid], red[lid + s], how);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn term(base: u32, r: u32) -> f32 {
    return x[base + strided_offset(r, p.red_rank, p.red_shape, p.red_strides)];
}

// Combine of every term of the row at `base`, starting from `init`.
fn row_total(base: u32, lid: u32, how: u32, init: f32) -> f32 {
    var acc = init;
    for (var r = lid; r < p.size; r = r + WG) {
        acc = combine(acc, term(base, r), how);
    }
    return tree(acc, lid, how);
}

fn row_base(wid: vec3<u32>, nwg: vec3<u32>) -> vec2<u32> {
    let o = wg_linear(wid, nwg);
    return vec2<u32>(o, strided_offset(o, p.kept_rank, p.kept_shape, p.kept_strides));
}

@compute @workgroup_size(128)
fn reduce_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let ob = row_base(wid, nwg);
    if (ob.x >= p.outs) { return; }
    let s = row_total(ob.y, lid, COMBINE_ADD, 0.0);
    if (lid == 0u) { out[ob.x] = s; }
}

@compute @workgroup_size(128)
fn reduce_mean(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let ob = row_base(wid, nwg);
    if (ob.x >= p.outs) { return; }
    let s = row_total(ob.y, lid, COMBINE_ADD, 0.0);
    // the mean of no terms is NaN in torch; a runtime 0/0 is not guaranteed to give it in WGSL
    if (lid == 0u) { out[ob.x] = select(s / f32(p.size), f32_nan(), p.size == 0u); }
}

@compute @workgroup_size(128)
fn reduce_amax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let ob = row_base(wid, nwg);
    if (ob.x >= p.outs) { return; }
    let m = row_total(ob.y, lid, COMBINE_MAX, -f32_inf());
    if (lid == 0u) { out[ob.x] = m; }
}

@compute @workgroup_size(128)
fn reduce_amin(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let ob = row_base(wid, nwg);
    if (ob.x >= p.outs) { return; }
    let m = row_total(ob.y, lid, COMBINE_MIN, f32_inf());
    if (lid == 0u) { out[ob.x] = m; }
}

@compute @workgroup_size(128)
fn reduce_var(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let ob = row_base(wid, nwg);
    if (ob.x >= p.outs) { return; }
    let mean = row_total(ob.y, lid, COMBINE_ADD, 0.0) / max(f32(p.size), 1.0);
    var ss = 0.0;
    for (var r = lid; r < p.size; r = r + WG) {
        let dev = term(ob.y, r) - mean;
        ss = ss + dev * dev;
    }
    ss = tree(ss, lid, COMBINE_ADD);
    let dof = max(0.0, f32(p.size) - p.correction);
    // torch: dof <= 0 gives inf, or NaN when the deviations are 0 too (0 / 0)
    let zero_dof = select(f32_inf(), f32_nan(), ss == 0.0 || is_nan(ss) || p.size == 0u);
    if (lid == 0u) { out[ob.x] = select(ss / dof, zero_dof, dof <= 0.0); }
}

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

// ---- argmax, argmin, median: an index out (i32: the executor holds int64 as i32) ----------
// A candidate is (value, index); an index of NO_INDEX (a lane with no terms) loses to any.
@group(0) @binding(2) var<storage, read_write> iout: array<i32>;     // argmax / argmin
@group(0) @binding(3) var<storage, read_write> median_idx: array<i32>;   // median's indices

const NO_INDEX: u32 = 0xffffffffu;
var<workgroup> redi: array<u32, WG>;

// Does (a, ia) beat (b, ib)? The larger (COMBINE_MAX) or smaller value; a NaN beats any number;
// equal values (or two NaNs) go to the lower index, so the first occurrence wins, as in torch.
fn arg_beats(a: f32, ia: u32, b: f32, ib: u32, how: u32) -> bool {
    if (ia == NO_INDEX || ib == NO_INDEX) { return ib == NO_INDEX && ia != NO_INDEX; }
    let na = is_nan(a);
    let nb = is_nan(b);
    if (na != nb) { return na; }
    if (na || a == b) { return ia < ib; }
    return select((a < b), (a > b), how == COMBINE_MAX);
}

// The winning index of the row at `base` (tree over red[] and redi[] together).
fn row_arg(base: u32, lid: u32, how: u32) -> u32 {
    var v = 0.0;
    var i = NO_INDEX;
    for (var r = lid; r < p.size; r = r + WG) {
        let t = term(base, r);
        if (arg_beats(t, r, v, i, how)) { v = t; i = r; }
    }
    red[lid] = v;
    redi[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s && arg_beats(red[lid + s], redi[lid + s], red[lid], redi[lid], how)) {
            red[lid] = red[lid + s];
            redi[lid] = redi[lid + s];
        }
        workgroupBarrier();
    }
    return redi[0];
}

@compute @workgroup_size(128)
fn reduce_argmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let ob = row_base(wid, nwg);
    if (ob.x >= p.outs) { return; }
    let i = row_arg(ob.y, lid, COMBINE_MAX);
    if (lid == 0u) { iout[ob.x] = i32(i); }
}

@compute @workgroup_size(128)
fn reduce_argmin(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let ob = row_base(wid, nwg);
    if (ob.x >= p.outs) { return; }
    let i = row_arg(ob.y, lid, COMBINE_MIN);
    if (lid == 0u) { iout[ob.x] = i32(i); }
}

// The lowest index over the workgroup's lanes.
fn tree_min_index(i: u32, lid: u32) -> u32 {
    redi[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) { redi[lid] = min(redi[lid], redi[lid + s]); }
        workgroupBarrier();
    }
    let r = redi[0];
    workgroupBarrier();
    return r;
}

// The index of the row's median: the first NaN if the row has one, else the first term r
// with (#terms < x_r) <= k < (#terms <= x_r), k = (size - 1) / 2 (the lower middle). Each lane
// ranks its own terms against the whole row: size^2 / WG reads per lane.
fn row_median(base: u32, lid: u32) -> u32 {
    var nan_at = NO_INDEX;
    for (var r = lid; r < p.size; r = r + WG) {
        if (is_nan(term(base, r))) { nan_at = min(nan_at, r); }
    }
    let first_nan = tree_min_index(nan_at, lid);
    let k = (p.size - 1u) / 2u;
    var found = NO_INDEX;
    for (var r = lid; r < p.size && found == NO_INDEX; r = r + WG) {
        let v = term(base, r);
        var less = 0u;
        var equal = 0u;
        for (var j = 0u; j < p.size; j = j + 1u) {
            let t = term(base, j);
            less = less + select(0u, 1u, t < v);
            equal = equal + select(0u, 1u, t == v);
        }
        if (less <= k && k < less + equal) { found = r; }
    }
    // ranked in any case: a branch on first_nan (workgroup memory) would leave the barriers
    // in non-uniform control flow
    return select(tree_min_index(found, lid), first_nan, first_nan != NO_INDEX);
}

@compute @workgroup_size(128)
fn reduce_median(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let ob = row_base(wid, nwg);
    if (ob.x >= p.outs) { return; }
    let i = row_median(ob.y, lid);
    if (lid == 0u) { out[ob.x] = term(ob.y, i); }
}

@compute @workgroup_size(128)
fn reduce_median_indices(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let ob = row_base(wid, nwg);
    if (ob.x >= p.outs) { return; }
    let i = row_median(ob.y, lid);
    if (lid == 0u) {
        out[ob.x] = term(ob.y, i);
        median_idx[ob.x] = i32(i);
    }
}

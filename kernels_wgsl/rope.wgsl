// Rotary embedding (delegate/ops/rope.py), one invocation per output element. Channel j < R
// of a row belongs to pair (a, b) with partner channel k:
//     interleaved: a = 2i, b = 2i + 1          half: a = i, b = i + R/2
//     out_a = x_a cos_a - x_b sin_a,   out_b = x_b cos_b + x_a sin_b
// channels j >= R copy x. The tables are read as if broadcast to lead + (width,), width R/2
// (an angle per pair, column i) or R (one per channel, column j), through element strides
// that are zero along broadcast dims.
//
// Entry `rope` rotates x; `rope_pair` rotates x and x1 (a layer's q and k) by the same tables
// in one grid: invocations [0, a.n) serve x, the next b.n serve x1. Both go through lane() and
// rotated(), so a pair's elements get exactly the arithmetic of two ropes.
//
// Entry `rope_cache` is rope_pair with k' written straight into its cache: invocations
// [0, q.n) rotate q; the next kw.n walk k's cache write as its strided copy would, each
// rotating the k element it reads (lane() of that element in k's own layout) and storing it
// in the cache; the last vw.n copy v into its cache. Each value is bit for bit what rope_pair
// and slice_scatter_pair would store.

override INTERLEAVED: bool = true;   // false: rotate-half pairs

struct Rotation {     // one rotated tensor
    n: u32,           // output elements
    dim: u32,         // D, x's last dim
    rotary_dim: u32,  // R, even, <= D
    width: u32,       // the tables' last dim: R/2 or R
    rank: u32,        // rank of x (and of the broadcast table shape)
    shape: array<vec4<u32>, 2>,    // x's leading dims, then width
    strides: array<vec4<u32>, 2>,  // the tables' element strides over that shape
}

struct RotationPair {
    a: Rotation,
    b: Rotation,
}

struct RopeCache {    // rope_cache: q's rotation, k's, then k's and v's cache writes
    q: Rotation,
    k: Rotation,
    kw: CopyParams,   // source offsets in k's (unrotated) layout
    vw: CopyParams,
}

// Binding 0 is each entry point's own params (an entry point uses only its own).
@group(0) @binding(0) var<uniform> p: Rotation;           // rope
@group(0) @binding(0) var<uniform> pair: RotationPair;    // rope_pair
@group(0) @binding(0) var<uniform> rc: RopeCache;         // rope_cache
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> cos_t: array<f32>;
@group(0) @binding(3) var<storage, read> sin_t: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> x1: array<f32>;            // rope_pair's second
@group(0) @binding(6) var<storage, read_write> out1: array<f32>;   // rope_cache: k's cache
@group(0) @binding(7) var<storage, read> v: array<f32>;             // rope_cache's v
@group(0) @binding(8) var<storage, read_write> v_cache: array<f32>;

// Where element i of tensor r finds its pair partner and its table entry. A channel past R
// is its own partner and reads table entry 0 (any entry: rotated() keeps x_i for it).
struct Lane {
    partner: u32,
    table: u32,
    second: bool,   // the channel is member b of its pair
    rotated: bool,  // the channel is below R
}

fn lane(i: u32, r: Rotation) -> Lane {
    let j = i % r.dim;
    if (j >= r.rotary_dim) {
        return Lane(i, 0u, false, false);
    }
    let half = r.rotary_dim / 2u;
    var second: bool;
    var pair_index: u32;
    var partner: u32;
    if (INTERLEAVED) {
        second = (j & 1u) == 1u;
        pair_index = j / 2u;
        partner = select(i + 1u, i - 1u, second);
    } else {
        second = j >= half;
        pair_index = select(j, j - half, second);
        partner = select(i + half, i - half, second);
    }
    let col = select(j, pair_index, r.width == half);
    let t = strided_offset((i / r.dim) * r.width + col, r.rank, r.shape, r.strides);
    return Lane(partner, t, second, true);
}

// x_i's output from x_i, its partner x_k and its cos and sin entries.
fn rotated(xi: f32, xk: f32, c: f32, s: f32, l: Lane) -> f32 {
    let xc = xi * c;
    let ps = xk * s;
    return select(xi, select(xc - ps, xc + ps, l.second), l.rotated);
}

// Element i of x (of x1), rotated by r: every entry point's one path to an output value.
fn rotated_x(i: u32, r: Rotation) -> f32 {
    let l = lane(i, r);
    return rotated(x[i], x[l.partner], cos_t[l.table], sin_t[l.table], l);
}

fn rotated_x1(i: u32, r: Rotation) -> f32 {
    let l = lane(i, r);
    return rotated(x1[i], x1[l.partner], cos_t[l.table], sin_t[l.table], l);
}

@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    out[i] = rotated_x(i, p);
}

@compute @workgroup_size(256)
fn rope_pair(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < pair.a.n) {
        out[i] = rotated_x(i, pair.a);
        return;
    }
    let e = i - pair.a.n;
    if (e < pair.b.n) {
        out1[e] = rotated_x1(e, pair.b);
    }
}

@compute @workgroup_size(256)
fn rope_cache(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < rc.q.n) {
        out[i] = rotated_x(i, rc.q);
        return;
    }
    let e = i - rc.q.n;
    if (e < rc.kw.n) {
        let o = copy_offsets(e, rc.kw);
        out1[o.y] = rotated_x1(o.x, rc.k);
        return;
    }
    let f = e - rc.kw.n;
    if (f < rc.vw.n) {
        let o = copy_offsets(f, rc.vw);
        v_cache[o.y] = v[o.x];
    }
}

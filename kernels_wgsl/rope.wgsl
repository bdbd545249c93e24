// Rotary embedding (delegate/ops/rope.py), one invocation per output element. Channel j < R
// of a row belongs to pair (a, b) with partner channel k:
//     interleaved: a = 2i, b = 2i + 1          half: a = i, b = i + R/2
//     out_a = x_a cos_a - x_b sin_a,   out_b = x_b cos_b + x_a sin_b
// channels j >= R copy x. The tables are read as if broadcast to lead + (width,), width R/2
// (an angle per pair, column i) or R (one per channel, column j), through element strides
// that are zero along broadcast dims.

override INTERLEAVED: bool = true;   // false: rotate-half pairs

struct RopeParams {
    n: u32,           // output elements
    dim: u32,         // D, x's last dim
    rotary_dim: u32,  // R, even, <= D
    width: u32,       // the tables' last dim: R/2 or R
    rank: u32,        // rank of x (and of the broadcast table shape)
    shape: array<vec4<u32>, 2>,    // x's leading dims, then width
    strides: array<vec4<u32>, 2>,  // the tables' element strides over that shape
}

@group(0) @binding(0) var<uniform> p: RopeParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> cos_t: array<f32>;
@group(0) @binding(3) var<storage, read> sin_t: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    let j = i % p.dim;
    if (j >= p.rotary_dim) {
        out[i] = x[i];
        return;
    }
    let half = p.rotary_dim / 2u;
    var second: bool;   // j is member b of its pair
    var pair: u32;
    var partner: u32;
    if (INTERLEAVED) {
        second = (j & 1u) == 1u;
        pair = j / 2u;
        partner = select(i + 1u, i - 1u, second);
    } else {
        second = j >= half;
        pair = select(j, j - half, second);
        partner = select(i + half, i - half, second);
    }
    let col = select(j, pair, p.width == half);
    let t = strided_offset((i / p.dim) * p.width + col, p.rank, p.shape, p.strides);
    let xc = x[i] * cos_t[t];
    let ps = x[partner] * sin_t[t];
    out[i] = select(xc - ps, xc + ps, second);
}

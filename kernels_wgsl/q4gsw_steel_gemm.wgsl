// tile_t is f16 where the device has shader-f16, else f32: the dispatch's prelude declares
// it (kernels_wgsl/q4gsw.py), so both variants are this one file.

// linear_q4gsw prefill (M > 1): "steel" tiled GEMM over 4-bit group-symmetric weights.
//   out[m, n] = bias[n] + sum_g scales[g, n] * sum_{k in group g} x[m, k] * q[n, k]
//   q[n, k]   = ((packed[n * K/8 + k/8] >> 4*(k%8)) & 0xF) - 8
// 16x16 workgroup, 64x64 output tile, BK = 16, a 4x4 block per thread. Per K-step every
// thread makes one vec4<f32> activation load (x bound as array<vec4<f32>>, K % 4 == 0) and
// unpacks 4 nibbles of one u32 weight word; tiles hold tile_t. x * q multiplies in tile_t
// (q is a small integer, exact in f16), sums in f32 over the group, and the group's scale is
// applied once at its end (BK divides every supported group size: no K-step straddles one).

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

const TILE: u32 = 64u;
const BK: u32 = 16u;
// Tiles as [BK][16] vec4s: element (k, t) holds rows (or columns) t, t+16, t+32, t+48, the
// four a thread owns, so the inner loop reads one vec4 of each per k.
var<workgroup> x_tile: array<vec4<tile_t>, 256>;   // x_tile[k * 16 + m % 16][m / 16]
var<workgroup> q_tile: array<vec4<tile_t>, 256>;   // q_tile[k * 16 + n % 16][n / 16]

fn load_tiles(m0: u32, n0: u32, k0: u32, lid: u32) {
    // activations: thread -> row lid/4, 4 consecutive k (one vec4<f32> load)
    let r = lid / 4u;
    let kq = (lid % 4u) * 4u;
    var v = vec4<f32>(0.0);
    if (m0 + r < p.m) {
        v = x[((m0 + r) * p.k + k0 + kq) / 4u];
    }
    let rt = r % 16u;
    let ri = r / 16u;
    x_tile[kq * 16u + rt][ri] = tile_t(v.x);
    x_tile[(kq + 1u) * 16u + rt][ri] = tile_t(v.y);
    x_tile[(kq + 2u) * 16u + rt][ri] = tile_t(v.z);
    x_tile[(kq + 3u) * 16u + rt][ri] = tile_t(v.w);
    // weights: thread -> column lid/4, 4 nibbles (one half of one u32 word)
    let c = lid / 4u;
    let part = lid % 4u;
    var word = 0x88888888u;   // q = 0 beyond the last column
    if (n0 + c < p.n) {
        word = packed[(n0 + c) * p.k_words + k0 / 8u + part / 2u];
    }
    let q = vec4<f32>((vec4<u32>(word >> ((part % 2u) * 16u)) >> vec4<u32>(0u, 4u, 8u, 12u))
                      & vec4<u32>(0xFu)) - 8.0;
    let kw = (part / 2u) * 8u + (part % 2u) * 4u;
    let ct = c % 16u;
    let cj = c / 16u;
    q_tile[kw * 16u + ct][cj] = tile_t(q.x);
    q_tile[(kw + 1u) * 16u + ct][cj] = tile_t(q.y);
    q_tile[(kw + 2u) * 16u + ct][cj] = tile_t(q.z);
    q_tile[(kw + 3u) * 16u + ct][cj] = tile_t(q.w);
}

fn column_scales(g: u32, n0: u32, tx: u32) -> vec4<f32> {
    let n = vec4<u32>(n0 + tx) + vec4<u32>(0u, 16u, 32u, 48u);
    let base = g * p.n_pad;
    // pad columns (n < n_pad) hold 0; beyond n_pad read column 0 and select 0
    let ok = n < vec4<u32>(p.n);
    let s = vec4<f32>(scales[base + select(0u, n.x, ok.x)], scales[base + select(0u, n.y, ok.y)],
                      scales[base + select(0u, n.z, ok.z)], scales[base + select(0u, n.w, ok.w)]);
    return select(vec4<f32>(0.0), s, ok);
}

fn store_row(gm: u32, n0: u32, tx: u32, r: vec4<f32>) {
    if (gm >= p.m) {
        return;
    }
    for (var j = 0u; j < 4u; j = j + 1u) {
        let gn = n0 + tx + 16u * j;
        if (gn < p.n) {
            var v = r[j];
            if (HAS_BIAS) {
                v = v + bias[gn];
            }
            out[gm * p.n + gn] = v;
        }
    }
}

// The 4x4 block lives in plain vec4 locals, not arrays: naga's dynamically indexed arrays
// end up in local memory on some drivers, which made this kernel ~10x slower on NVIDIA.
@compute @workgroup_size(16, 16)
fn q4gsw_steel_gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_id) lid3: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let wg = wg_linear(wid, nwg);
    let tm = wg / p.tiles_n;
    if (tm >= p.tiles_m) {
        return;   // uniform per workgroup: the barriers below stay in uniform control flow
    }
    let m0 = tm * TILE;
    let n0 = (wg % p.tiles_n) * TILE;
    let tx = lid3.x;
    let ty = lid3.y;
    var acc0 = vec4<f32>(0.0);   // row ty + 16i, columns tx + 16j (j = component)
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var grp0 = vec4<f32>(0.0);   // the same block, unscaled, over the current group
    var grp1 = vec4<f32>(0.0);
    var grp2 = vec4<f32>(0.0);
    var grp3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < p.k; k0 = k0 + BK) {
        load_tiles(m0, n0, k0, lid);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            let qv = q_tile[kk * 16u + tx];
            let xv = x_tile[kk * 16u + ty];
            grp0 = grp0 + vec4<f32>(xv.x * qv);
            grp1 = grp1 + vec4<f32>(xv.y * qv);
            grp2 = grp2 + vec4<f32>(xv.z * qv);
            grp3 = grp3 + vec4<f32>(xv.w * qv);
        }
        if ((k0 + BK) % p.group_size == 0u) {
            let s = column_scales(k0 / p.group_size, n0, tx);
            acc0 = fma(grp0, s, acc0);
            acc1 = fma(grp1, s, acc1);
            acc2 = fma(grp2, s, acc2);
            acc3 = fma(grp3, s, acc3);
            grp0 = vec4<f32>(0.0);
            grp1 = vec4<f32>(0.0);
            grp2 = vec4<f32>(0.0);
            grp3 = vec4<f32>(0.0);
        }
        workgroupBarrier();
    }
    store_row(m0 + ty, n0, tx, acc0);
    store_row(m0 + ty + 16u, n0, tx, acc1);
    store_row(m0 + ty + 32u, n0, tx, acc2);
    store_row(m0 + ty + 48u, n0, tx, acc3);
}

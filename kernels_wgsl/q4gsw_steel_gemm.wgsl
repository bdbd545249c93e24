// tile_t is f16 where the device has shader-f16, else f32, and store_output() is the epilogue:
// the dispatch's prelude declares both (kernels_wgsl/q4gsw.py), so every variant is this file.

// linear_q4gsw prefill (M > 1): "steel" tiled GEMM over 4-bit group-symmetric weights.
//   out[m, n] = sum_k x[m, k] * w[n, k],   w[n, k] = scales[k / gs, n] * q[n, k]   (+ epilogue)
//   q[n, k]   = ((packed[n * K/8 + k/8] >> 4*(k%8)) & 0xF) - 8
// 16x16 workgroup, 64x64 output tile, BK = 16, a 4x4 block per thread. Per K-step every
// thread makes one vec4<f32> activation load (x bound as array<vec4<f32>>, K % 4 == 0) and
// unpacks 4 nibbles of one u32 weight word, which it dequantizes with its column's group
// scale; tiles hold tile_t. Each output is one f32 FMA chain over k = 0, 1, .., K-1 of
// x * w, exactly as in q4gsw_steel_gemm128.wgsl: the two tiles round alike, so the router's
// choice between them (or a fused op's wider N) changes no output bit.

struct Q4Params {
    m: u32, n: u32, k: u32, group_size: u32,
    n_pad: u32, k_words: u32, tiles_m: u32, tiles_n: u32,
}

@group(0) @binding(0) var<uniform> p: Q4Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> packed: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<f32>;

const TILE: u32 = 64u;
const BK: u32 = 16u;
// Tiles as [BK][16] vec4s: element (k, t) holds rows (or columns) t, t+16, t+32, t+48, the
// four a thread owns, so the inner loop reads one vec4 of each per k.
var<workgroup> x_tile: array<vec4<tile_t>, 256>;   // x_tile[k * 16 + m % 16][m / 16]
var<workgroup> w_tile: array<vec4<tile_t>, 256>;   // w_tile[k * 16 + n % 16][n / 16]

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
    // past the last column: any valid word, scale 0
    let n = min(n0 + c, p.n - 1u);
    let word = packed[n * p.k_words + k0 / 8u + part / 2u];
    let scale = select(0.0, scales[(k0 / p.group_size) * p.n_pad + n], n0 + c < p.n);
    let q = vec4<f32>((vec4<u32>(word >> ((part % 2u) * 16u)) >> vec4<u32>(0u, 4u, 8u, 12u))
                      & vec4<u32>(0xFu)) - 8.0;
    let w = q * scale;
    let kw = (part / 2u) * 8u + (part % 2u) * 4u;
    let ct = c % 16u;
    let cj = c / 16u;
    w_tile[kw * 16u + ct][cj] = tile_t(w.x);
    w_tile[(kw + 1u) * 16u + ct][cj] = tile_t(w.y);
    w_tile[(kw + 2u) * 16u + ct][cj] = tile_t(w.z);
    w_tile[(kw + 3u) * 16u + ct][cj] = tile_t(w.w);
}

fn store_row(gm: u32, n0: u32, tx: u32, r: vec4<f32>) {
    if (gm >= p.m) {
        return;
    }
    for (var j = 0u; j < 4u; j = j + 1u) {
        let gn = n0 + tx + 16u * j;
        if (gn < p.n) {
            store_output(gm, gn, r[j]);
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
    for (var k0 = 0u; k0 < p.k; k0 = k0 + BK) {
        load_tiles(m0, n0, k0, lid);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            // f16 tiles are widened first: the product of two f16 values is exact in f32
            let wv = vec4<f32>(w_tile[kk * 16u + tx]);
            let xv = vec4<f32>(x_tile[kk * 16u + ty]);
            acc0 = fma(vec4<f32>(xv.x), wv, acc0);
            acc1 = fma(vec4<f32>(xv.y), wv, acc1);
            acc2 = fma(vec4<f32>(xv.z), wv, acc2);
            acc3 = fma(vec4<f32>(xv.w), wv, acc3);
        }
        workgroupBarrier();
    }
    store_row(m0 + ty, n0, tx, acc0);
    store_row(m0 + ty + 16u, n0, tx, acc1);
    store_row(m0 + ty + 32u, n0, tx, acc2);
    store_row(m0 + ty + 48u, n0, tx, acc3);
}

// tile_t is f16 where the device has shader-f16, else f32, and store_output() is the epilogue:
// the dispatch's prelude declares both (kernels_wgsl/q4gsw.py), so every variant is this file.

// linear_q4gsw prefill, larger M: a 128x128 output tile per workgroup of 256 threads, 8x8
// outputs per thread.
//   out[m, n] = sum_k x[m, k] * w[n, k],   w[n, k] = scales[k / gs, n] * q[n, k]   (+ epilogue)
//   q[n, k]   = ((packed[n * K/8 + k/8] >> 4*(k%8)) & 0xF) - 8
// K-steps of BK = 8, one u32 weight word per column per step. Per step each thread loads one
// vec4<f32> of x (row lid/2, k half lid%2) and one weight word (column lid/2), and dequantizes
// its half of the word (4 nibbles) with the column's group scale, which it reloads only when a
// group starts. w_tile then holds w itself: the inner loop is plain FMAs, and the scale costs one
// multiply per weight per 128 rows instead of a second accumulator set.
// x_tile and w_tile are double-buffered: the next step's global loads are issued before this
// step's FMAs and stored after them, so one barrier per step suffices (a stage is rewritten
// only after every thread has passed the barrier that ended its last read).
// Thread (tx, ty) = (lid % 16, lid / 16) owns rows 4ty..4ty+3 and 64+4ty..64+4ty+3 and columns
// 4tx.. and 64+4tx..: per k it reads 2 vec4 of x_tile (broadcast across a warp) and 2 of
// w_tile (consecutive) for 64 FMAs. f16 tiles are widened before the FMA: the product of two
// f16 values is exact in f32, so that is the f16 multiply with f32 accumulation.
// Workgroup memory: 2 stages x 2 tiles x 8 x 128 x sizeof(tile_t) = 16 KiB (f32), 8 KiB (f16).
//
// Each output is one f32 FMA chain over k = 0, 1, .., K-1 of x * w, as in the 64x64 tile
// (q4gsw_steel_gemm.wgsl): the router's choice of tile changes no output bit.
// steel_tile() is the K loop over [k0, k1) for one tile and returns the 8x8 block per thread;
// the entry point only adds the stores, through the prelude's store_output() (one output and a
// bias, or the fused multi-output scatter).
//
// Split K (SPLITS > 1, from the prelude with K_CHUNK): K cut into chunks of K_CHUNK, one
// workgroup per (chunk, tile), so that a grid too small to fill the GPU (a 2048-wide output
// at M = 512 is 64 tiles for 132 SMs) gets more workgroups. Each writes its raw block to
// `partials` [chunk][m][n_pad], and q4gsw_splitk_reduce adds the chunks in order, p0 + p1 + ..,
// and stores the sum through the same epilogue. A chunk's sum is the same FMA chain over its
// k as the unsplit tile's, so an output's bits depend on K and K_CHUNK, never on N or on which
// tile ran: kernels_wgsl/q4gsw.py decides the split by K and M alone, which keeps a fused op's
// columns bit for bit.

struct Q4Params {
    m: u32, n: u32, k: u32, group_size: u32,
    n_pad: u32, k_words: u32, tiles_m: u32, tiles_n: u32,
}

@group(0) @binding(0) var<uniform> p: Q4Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> packed: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<f32>;
// [chunk][m][n_pad / 4] raw blocks of a split K (binding 7; SPLITS == 1 binds a dummy)
@group(0) @binding(7) var<storage, read_write> partials: array<vec4<f32>>;

const BM: u32 = 128u;
const BN: u32 = 128u;
const BK: u32 = 8u;
const ROW4: u32 = BM / 4u;         // vec4s per k in one tile stage
const STAGE: u32 = BK * ROW4;      // vec4s per tile stage
var<workgroup> x_tile: array<vec4<tile_t>, 512>;   // [stage][k][m / 4], component m % 4
var<workgroup> w_tile: array<vec4<tile_t>, 512>;   // [stage][k][n / 4], component n % 4

// A thread's 8x8 block as named vec4s (indexed arrays ended up in local memory on NVIDIA):
// rI: row 4ty+I (I < 4) or 64+4ty+(I-4); a: columns 4tx..4tx+3, b: columns 64+4tx..64+4tx+3.
struct Tile8x8 {
    r0a: vec4<f32>, r0b: vec4<f32>, r1a: vec4<f32>, r1b: vec4<f32>,
    r2a: vec4<f32>, r2b: vec4<f32>, r3a: vec4<f32>, r3b: vec4<f32>,
    r4a: vec4<f32>, r4b: vec4<f32>, r5a: vec4<f32>, r5b: vec4<f32>,
    r6a: vec4<f32>, r6b: vec4<f32>, r7a: vec4<f32>, r7b: vec4<f32>,
}

// acc + (rows a0, a1) outer (columns b0, b1)
fn mac(acc: Tile8x8, a0: vec4<f32>, a1: vec4<f32>, b0: vec4<f32>, b1: vec4<f32>) -> Tile8x8 {
    var t = acc;
    t.r0a = fma(vec4<f32>(a0.x), b0, t.r0a);
    t.r0b = fma(vec4<f32>(a0.x), b1, t.r0b);
    t.r1a = fma(vec4<f32>(a0.y), b0, t.r1a);
    t.r1b = fma(vec4<f32>(a0.y), b1, t.r1b);
    t.r2a = fma(vec4<f32>(a0.z), b0, t.r2a);
    t.r2b = fma(vec4<f32>(a0.z), b1, t.r2b);
    t.r3a = fma(vec4<f32>(a0.w), b0, t.r3a);
    t.r3b = fma(vec4<f32>(a0.w), b1, t.r3b);
    t.r4a = fma(vec4<f32>(a1.x), b0, t.r4a);
    t.r4b = fma(vec4<f32>(a1.x), b1, t.r4b);
    t.r5a = fma(vec4<f32>(a1.y), b0, t.r5a);
    t.r5b = fma(vec4<f32>(a1.y), b1, t.r5b);
    t.r6a = fma(vec4<f32>(a1.z), b0, t.r6a);
    t.r6b = fma(vec4<f32>(a1.z), b1, t.r6b);
    t.r7a = fma(vec4<f32>(a1.w), b0, t.r7a);
    t.r7b = fma(vec4<f32>(a1.w), b1, t.r7b);
    return t;
}

// x[m0 + lid/2, k0 + 4*(lid%2) .. +3], zeros past the last row
fn x_load(m0: u32, k0: u32, lid: u32) -> vec4<f32> {
    let m = m0 + lid / 2u;
    let ok = m < p.m;
    let v = x[(select(0u, m, ok) * p.k + k0) / 4u + lid % 2u];
    return select(vec4<f32>(0.0), v, ok);
}

// The weight word of column n0 + lid/2 at k0; past the last column any valid word (scale 0).
fn word_load(n0: u32, k0: u32, lid: u32) -> u32 {
    return packed[min(n0 + lid / 2u, p.n - 1u) * p.k_words + k0 / 8u];
}

fn scale_load(n0: u32, k0: u32, lid: u32) -> f32 {
    let n = n0 + lid / 2u;
    let s = scales[(k0 / p.group_size) * p.n_pad + min(n, p.n - 1u)];
    return select(0.0, s, n < p.n);
}

// Store this thread's share of one K-step into stage s: 4 k of x row lid/2 and 4 dequantized
// k of weight column lid/2 (the nibbles of its half of the word).
fn stage_store(s: u32, lid: u32, xv: vec4<f32>, word: u32, scale: f32) {
    let half = lid % 2u;
    let r = lid / 2u;
    let i = s * STAGE + half * 4u * ROW4 + r / 4u;
    let c = r % 4u;
    let q = vec4<f32>((vec4<u32>(word >> (16u * half)) >> vec4<u32>(0u, 4u, 8u, 12u))
                      & vec4<u32>(0xFu)) - 8.0;
    let w = q * scale;
    x_tile[i][c] = tile_t(xv.x);
    x_tile[i + ROW4][c] = tile_t(xv.y);
    x_tile[i + 2u * ROW4][c] = tile_t(xv.z);
    x_tile[i + 3u * ROW4][c] = tile_t(xv.w);
    w_tile[i][c] = tile_t(w.x);
    w_tile[i + ROW4][c] = tile_t(w.y);
    w_tile[i + 2u * ROW4][c] = tile_t(w.z);
    w_tile[i + 3u * ROW4][c] = tile_t(w.w);
}

fn mac_stage(acc: Tile8x8, s: u32, tx: u32, ty: u32) -> Tile8x8 {
    var t = acc;
    for (var kk = 0u; kk < BK; kk = kk + 1u) {
        let i = s * STAGE + kk * ROW4;
        t = mac(t, vec4<f32>(x_tile[i + ty]), vec4<f32>(x_tile[i + 16u + ty]),
                vec4<f32>(w_tile[i + tx]), vec4<f32>(w_tile[i + 16u + tx]));
    }
    return t;
}

// The K loop over [k0, k1) of the tile at (m0, n0), both multiples of BK. Call from uniform
// control flow (it has barriers).
fn steel_tile(m0: u32, n0: u32, lid: u32, k0: u32, k1: u32) -> Tile8x8 {
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc = Tile8x8();
    var scale = scale_load(n0, k0, lid);
    stage_store(0u, lid, x_load(m0, k0, lid), word_load(n0, k0, lid), scale);
    workgroupBarrier();
    let steps = (k1 - k0) / BK;
    for (var t = 0u; t < steps; t = t + 1u) {
        let s = t % 2u;
        let k_next = k0 + (t + 1u) * BK;
        let more = t + 1u < steps;
        var xv = vec4<f32>(0.0);
        var word = 0u;
        if (more) {   // issued now, consumed after this step's FMAs
            xv = x_load(m0, k_next, lid);
            word = word_load(n0, k_next, lid);
            if (k_next % p.group_size == 0u) {
                scale = scale_load(n0, k_next, lid);
            }
        }
        acc = mac_stage(acc, s, tx, ty);
        if (more) {
            stage_store(1u - s, lid, xv, word, scale);
        }
        workgroupBarrier();
    }
    return acc;
}

// columns n .. n+3 of row m (n a multiple of 4), those below N, as two pairs: the thread that
// stores a pair holds both, as the SwiGLU epilogue needs (q4gsw_epilogue_swiglu.wgsl)
fn store4(m: u32, n: u32, v: vec4<f32>) {
    if (n < p.n) {
        store_pair(m, n, v.x, v.y);
    }
    if (n + 2u < p.n) {
        store_pair(m, n + 2u, v.z, v.w);
    }
}

// Row m of a thread's block (columns n0 + 4tx .. and n0 + 64 + 4tx ..), rows past M dropped:
// unsplit through the epilogue; split, raw into chunk c's partials, columns up to n_pad (the
// reduce reads only those below N)
fn store_row(c: u32, m: u32, n0: u32, tx: u32, a: vec4<f32>, b: vec4<f32>) {
    if (m >= p.m) {
        return;
    }
    if (SPLITS == 1u) {
        store4(m, n0 + 4u * tx, a);
        store4(m, n0 + 64u + 4u * tx, b);
        return;
    }
    let row = ((c * p.m + m) * p.n_pad) / 4u;
    if (n0 + 4u * tx < p.n_pad) {
        partials[row + (n0 / 4u) + tx] = a;
    }
    if (n0 + 64u + 4u * tx < p.n_pad) {
        partials[row + (n0 / 4u) + 16u + tx] = b;
    }
}

fn store_tile(t: Tile8x8, c: u32, m0: u32, n0: u32, lid: u32) {
    let tx = lid % 16u;
    let r = m0 + 4u * (lid / 16u);
    store_row(c, r, n0, tx, t.r0a, t.r0b);
    store_row(c, r + 1u, n0, tx, t.r1a, t.r1b);
    store_row(c, r + 2u, n0, tx, t.r2a, t.r2b);
    store_row(c, r + 3u, n0, tx, t.r3a, t.r3b);
    store_row(c, r + 64u, n0, tx, t.r4a, t.r4b);
    store_row(c, r + 65u, n0, tx, t.r5a, t.r5b);
    store_row(c, r + 66u, n0, tx, t.r6a, t.r6b);
    store_row(c, r + 67u, n0, tx, t.r7a, t.r7b);
}

// workgroup = (chunk, row tile, column tile), the chunk slowest
@compute @workgroup_size(256)
fn q4gsw_steel_gemm128(@builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let wg = wg_linear(wid, nwg);
    let tiles = p.tiles_m * p.tiles_n;
    let c = wg / tiles;
    if (c >= SPLITS) {
        return;   // uniform per workgroup: the barriers in steel_tile stay in uniform control flow
    }
    let tm = (wg % tiles) / p.tiles_n;
    let m0 = tm * BM;
    let n0 = (wg % p.tiles_n) * BN;
    let k0 = c * K_CHUNK;   // unsplit: c = 0, the whole of K
    let k1 = select(min(p.k, k0 + K_CHUNK), p.k, SPLITS == 1u);
    store_tile(steel_tile(m0, n0, lid, k0, k1), c, m0, n0, lid);
}

// Split K's second pass: a thread per 4 columns n .. n + 3 of a row, each the chunks' sum in
// chunk order, stored as two pairs like a tile's (store4).
@compute @workgroup_size(256)
fn q4gsw_splitk_reduce(@builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    let quads = p.n_pad / 4u;
    let m = i / quads;
    if (m >= p.m) {
        return;
    }
    let at = m * quads + i % quads;
    let step = p.m * quads;
    var v = partials[at];
    for (var c = 1u; c < SPLITS; c = c + 1u) {
        v = v + partials[c * step + at];
    }
    store4(m, 4u * (i % quads), v);
}

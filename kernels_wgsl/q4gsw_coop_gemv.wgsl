// linear_q4gsw decode (M == 1): cooperative GEMV over 4-bit group-symmetric weights.
//   out[n] = sum_w scales[8w / gs, n] * dot(q[n, 8w .. 8w+7], x[8w .. 8w+7])   (+ epilogue)
// 64 lanes and 8 output columns per workgroup. Lane l takes words w = l, l + 64, ... of the 8
// columns' rows (consecutive lanes read consecutive words), 4 words per column per loop step:
// 32 independent u32 loads, 128 bytes, in flight per lane. A word's two activation vec4s and
// the 8 columns' scales (two vec4 loads) serve all 8 columns. (Measured on an H200 at 2
// columns: one u32 per lane beat one vec4<u32> per lane by ~1.9x. With vec4<u32> a lane's 32
// activations are 128 contiguous bytes, so each warp-wide activation load touches 32 cache
// lines instead of 8.)
// Nibble decode with no int-to-float conversion (quarter rate on NVIDIA): OR-ing an integer
// below 2^23 into the mantissa of 2^23 gives 2^23 + that integer exactly, so
//   bitcast<f32>(0x4B000000 | (word & (0xF << 4i))) - (2^23 + 8 * 16^i) = (v_i - 8) * 16^i
// is q_i * 16^i, and the activations are prescaled by 16^-i once per word (shared by the 8
// columns): per nibble one and-or, one subtract and one FMA, all f32 and exact but for the
// FMA's rounding.
// The cross-lane sums and the entry point come from the prelude (q4gsw_gemv_reduce_*.wgsl):
// subgroupAdd where the device has subgroups, else workgroup memory. So does store_output(),
// the epilogue (q4gsw_epilogue_*.wgsl). A column's sum depends on nothing but its own row:
// where it sits among the 8 (a fused op's wider N moves it) changes no output bit.

struct Q4Params {
    m: u32, n: u32, k: u32, group_size: u32,
    n_pad: u32, k_words: u32, tiles_m: u32, tiles_n: u32,
}

@group(0) @binding(0) var<uniform> p: Q4Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> packed: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<vec4<f32>>;   // N padded to 4

const LANES: u32 = 64u;
const COLS: u32 = 8u;
const UNROLL: u32 = 4u;   // words per column per lane per loop step
const NIBBLE_MASK = vec4<u32>(0xFu, 0xF0u, 0xF00u, 0xF000u);
const F32_2P23: u32 = 0x4B000000u;
const NIBBLE_BIAS = vec4<f32>(8388616.0, 8388736.0, 8390656.0, 8421376.0);   // 2^23 + 8*16^i
const NIBBLE_WEIGHT = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);  // 16^-i

// Sums for the workgroup's 8 columns: lo = n0..n0+3, hi = n0+4..n0+7.
struct Cols8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn col_of(c: Cols8, j: u32) -> f32 {
    return select(c.lo[j % 4u], c.hi[j % 4u], j >= 4u);
}

// sum_i q_i * x_i over the word's 8 nibbles; xs_lo/xs_hi are x[8w..8w+7] prescaled by 16^-i
fn nibble_dot(word: u32, xs_lo: vec4<f32>, xs_hi: vec4<f32>) -> f32 {
    let lo = bitcast<vec4<f32>>((vec4<u32>(word) & NIBBLE_MASK) | vec4<u32>(F32_2P23));
    let hi = bitcast<vec4<f32>>((vec4<u32>(word >> 16u) & NIBBLE_MASK) | vec4<u32>(F32_2P23));
    return dot(lo - NIBBLE_BIAS, xs_lo) + dot(hi - NIBBLE_BIAS, xs_hi);
}

// acc + word w of the 8 rows (first words rows_lo, rows_hi), scaled; nothing past the row's end
// (the loads are clamped, not branched, so every step's loads are issued together).
fn word_step(acc: Cols8, w: u32, rows_lo: vec4<u32>, rows_hi: vec4<u32>, s_lo: u32,
             s_hi: u32) -> Cols8 {
    let ok = w < p.k_words;
    let wc = select(0u, w, ok);
    let xs_lo = x[2u * wc] * NIBBLE_WEIGHT;
    let xs_hi = x[2u * wc + 1u] * NIBBLE_WEIGHT;
    let g = (8u * wc) / p.group_size * (p.n_pad / 4u);
    let d_lo = vec4<f32>(nibble_dot(packed[rows_lo.x + wc], xs_lo, xs_hi),
                         nibble_dot(packed[rows_lo.y + wc], xs_lo, xs_hi),
                         nibble_dot(packed[rows_lo.z + wc], xs_lo, xs_hi),
                         nibble_dot(packed[rows_lo.w + wc], xs_lo, xs_hi));
    let d_hi = vec4<f32>(nibble_dot(packed[rows_hi.x + wc], xs_lo, xs_hi),
                         nibble_dot(packed[rows_hi.y + wc], xs_lo, xs_hi),
                         nibble_dot(packed[rows_hi.z + wc], xs_lo, xs_hi),
                         nibble_dot(packed[rows_hi.w + wc], xs_lo, xs_hi));
    var r = acc;
    r.lo = r.lo + select(vec4<f32>(0.0), d_lo * scales[g + s_lo], ok);
    r.hi = r.hi + select(vec4<f32>(0.0), d_hi * scales[g + s_hi], ok);
    return r;
}

// This lane's share of columns n0..n0+7. Columns past N repeat column N-1 (never stored);
// those past n_pad read the scales of n0..n0+3.
fn lane_partials(n0: u32, lane: u32) -> Cols8 {
    let last = vec4<u32>(p.n - 1u);
    let rows_lo = min(vec4<u32>(n0) + vec4<u32>(0u, 1u, 2u, 3u), last) * p.k_words;
    let rows_hi = min(vec4<u32>(n0) + vec4<u32>(4u, 5u, 6u, 7u), last) * p.k_words;
    let s_lo = n0 / 4u;
    let s_hi = select(s_lo, s_lo + 1u, n0 + 4u < p.n_pad);
    var acc = Cols8();
    for (var w0 = lane; w0 < p.k_words; w0 = w0 + UNROLL * LANES) {
        acc = word_step(acc, w0, rows_lo, rows_hi, s_lo, s_hi);
        acc = word_step(acc, w0 + LANES, rows_lo, rows_hi, s_lo, s_hi);
        acc = word_step(acc, w0 + 2u * LANES, rows_lo, rows_hi, s_lo, s_hi);
        acc = word_step(acc, w0 + 3u * LANES, rows_lo, rows_hi, s_lo, s_hi);
    }
    return acc;
}

// column n0 + j of the one row, if below N
fn store_column(n0: u32, j: u32, total: f32) {
    if (n0 + j < p.n) {
        store_output(0u, n0 + j, total);
    }
}

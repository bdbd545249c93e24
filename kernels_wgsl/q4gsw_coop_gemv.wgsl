// linear_q4gsw decode (M == 1): cooperative GEMV over 4-bit group-symmetric weights.
//   out[n] = sum_j scales[g(j), n] * dot(q[n, chunk j], x[chunk j])   (+ epilogue)
// A chunk is WORDS packed u32 words (8 * WORDS weights) read by one load of a wchunk (u32,
// vec2<u32> or vec4<u32>); it lies in one scale group, g(j) = 8 * WORDS * j / GROUP.
// A workgroup is LANES lanes and owns COLS = 4 * QUADS output columns: lane l takes chunks
// j = l, l + LANES, l + 2 * LANES, .. of every column's row (consecutive lanes read consecutive
// chunks), UNROLL of them per loop step, and the lanes' sums meet in the prelude's reduction.
// The prelude (kernels_wgsl/q4gsw.py, GemvConfig) sets wchunk, words4() and the constants,
// and the prologue: begin_x(lane), which every lane calls first, and x_at(q), x's vec4 q as the
// kernel reads it (plain: x[q]; with a fused RMSNorm, q4gsw_prologue_norm.wgsl's normalized x).
//
// Bits: a column's value depends on its own row, K, WORDS, LANES and the reduction, never on
// COLS, UNROLL, X_STAGED or where the column sits in the workgroup: each lane sums its chunks
// in increasing j as one fma chain, every product written as an fma (no contraction left to
// the compiler), and the cross-lane sums add the same lanes in the same order for every column.
// So a fused op (wider N, other COLS) gives each column the bits its own linear gives.
//
// Nibble decode with no int-to-float conversion (quarter rate on NVIDIA): OR-ing an integer
// below 2^23 into the mantissa of 2^23 gives 2^23 + that integer exactly, so
//   bitcast<f32>(0x4B000000 | (word & (0xF << 4i))) - (2^23 + 8 * 16^i) = (v_i - 8) * 16^i
// is q_i * 16^i, and the activations are prescaled by 16^-i once per chunk (shared by the
// COLS columns): per weight one and-or, one subtract and one fma, all exact but the fma.
// Loads: a step first issues every weight and scale load of its UNROLL chunks (the ones that
// wait on memory), then reads x: from global memory (L1 hits), or with X_STAGED from a copy
// the workgroup stages in workgroup memory, laid out [x vec4 i][chunk] so that the lanes'
// reads are consecutive (a vec4<u32> chunk needs 128 contiguous bytes of x per lane, which a
// warp-wide global read spreads over 32 cache lines).

struct Q4Params {
    m: u32, n: u32, k: u32, group_size: u32,
    n_pad: u32, k_words: u32, tiles_m: u32, tiles_n: u32,
}

@group(0) @binding(0) var<uniform> p: Q4Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> packed: array<wchunk>;
@group(0) @binding(3) var<storage, read> scales: array<vec4<f32>>;   // N padded to 4

const COLS: u32 = 4u * QUADS;
const XV: u32 = 2u * WORDS;               // x vec4s per chunk
const STEP: u32 = UNROLL * LANES;         // chunks per loop step of the workgroup
const X_ROW: u32 = STEP + 1u;             // staged x row: odd, so the copy's stores spread too
var<workgroup> x_stage: array<vec4<f32>, X_STAGE_LEN>;   // [i][chunk of the step]

const NIBBLE_MASK = vec4<u32>(0xFu, 0xF0u, 0xF00u, 0xF000u);
const F32_2P23: u32 = 0x4B000000u;
const NIBBLE_BIAS = vec4<f32>(8388616.0, 8388736.0, 8390656.0, 8421376.0);   // 2^23 + 8*16^i
const NIBBLE_WEIGHT = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);  // 16^-i

// Named fields, not arrays: indexed private arrays ended up in local memory on NVIDIA.
// Quads past QUADS, words past WORDS and steps past UNROLL stay zero and unread.
struct Quad {   // one chunk of 4 columns' rows
    a: wchunk, b: wchunk, c: wchunk, d: wchunk,
}
struct Block {   // one chunk of the COLS columns' rows, and its group's scales
    q0: Quad, q1: Quad, q2: Quad, q3: Quad,
    s: Acc,
}
struct Acc {     // one value per column: q0 = columns n0..n0+3, q1 = n0+4.., ..
    q0: vec4<f32>, q1: vec4<f32>, q2: vec4<f32>, q3: vec4<f32>,
}
struct XChunk {  // x of one chunk, prescaled: lo/hi nibbles of word 0, 1, ..
    a0: vec4<f32>, b0: vec4<f32>, a1: vec4<f32>, b1: vec4<f32>,
    a2: vec4<f32>, b2: vec4<f32>, a3: vec4<f32>, b3: vec4<f32>,
}
struct Rows {    // first chunk of each column's row; columns past N repeat row N-1
    r0: vec4<u32>, r1: vec4<u32>, r2: vec4<u32>, r3: vec4<u32>,
}

fn acc_col(a: Acc, c: u32) -> f32 {
    let q = select(select(a.q0, a.q1, c >= 4u), select(a.q2, a.q3, c >= 12u), c >= 8u);
    return q[c % 4u];
}

// acc + sum_i q_i * x_i over the word's 8 nibbles; xa/xb: x of its low/high 4, prescaled
fn nibble_dot(word: u32, xa: vec4<f32>, xb: vec4<f32>, acc: f32) -> f32 {
    let lo = bitcast<vec4<f32>>((vec4<u32>(word) & NIBBLE_MASK) | vec4<u32>(F32_2P23))
             - NIBBLE_BIAS;
    let hi = bitcast<vec4<f32>>((vec4<u32>(word >> 16u) & NIBBLE_MASK) | vec4<u32>(F32_2P23))
             - NIBBLE_BIAS;
    var d = fma(lo.x, xa.x, acc);
    d = fma(lo.y, xa.y, d);
    d = fma(lo.z, xa.z, d);
    d = fma(lo.w, xa.w, d);
    d = fma(hi.x, xb.x, d);
    d = fma(hi.y, xb.y, d);
    d = fma(hi.z, xb.z, d);
    return fma(hi.w, xb.w, d);
}

fn chunk_dot(c: wchunk, xc: XChunk) -> f32 {
    let w = words4(c);
    var d = nibble_dot(w.x, xc.a0, xc.b0, 0.0);
    if (WORDS > 1u) {
        d = nibble_dot(w.y, xc.a1, xc.b1, d);
    }
    if (WORDS > 2u) {
        d = nibble_dot(w.z, xc.a2, xc.b2, d);
        d = nibble_dot(w.w, xc.a3, xc.b3, d);
    }
    return d;
}

fn quad_dot(q: Quad, xc: XChunk) -> vec4<f32> {
    return vec4<f32>(chunk_dot(q.a, xc), chunk_dot(q.b, xc), chunk_dot(q.c, xc),
                     chunk_dot(q.d, xc));
}

fn load_quad(r: vec4<u32>, j: u32) -> Quad {
    return Quad(packed[r.x + j], packed[r.y + j], packed[r.z + j], packed[r.w + j]);
}

// chunk j (< the row's chunks) of every column, and the scales of its group
fn load_block(rows: Rows, sq: vec4<u32>, j: u32) -> Block {
    let g = (8u * WORDS * j) / GROUP * (p.n_pad / 4u);
    var b: Block;
    b.q0 = load_quad(rows.r0, j);
    b.s.q0 = scales[g + sq.x];
    if (QUADS > 1u) {
        b.q1 = load_quad(rows.r1, j);
        b.s.q1 = scales[g + sq.y];
    }
    if (QUADS > 2u) {
        b.q2 = load_quad(rows.r2, j);
        b.q3 = load_quad(rows.r3, j);
        b.s.q2 = scales[g + sq.z];
        b.s.q3 = scales[g + sq.w];
    }
    return b;
}

// x vec4 i of chunk j, which is chunk `slot` of the staged step
fn x_vec(j: u32, slot: u32, i: u32) -> vec4<f32> {
    if (X_STAGED) {
        return x_stage[i * X_ROW + slot];
    }
    return x_at(XV * j + i);
}

fn load_x(j: u32, slot: u32) -> XChunk {
    var c: XChunk;
    c.a0 = x_vec(j, slot, 0u) * NIBBLE_WEIGHT;
    c.b0 = x_vec(j, slot, 1u) * NIBBLE_WEIGHT;
    if (WORDS > 1u) {
        c.a1 = x_vec(j, slot, 2u) * NIBBLE_WEIGHT;
        c.b1 = x_vec(j, slot, 3u) * NIBBLE_WEIGHT;
    }
    if (WORDS > 2u) {
        c.a2 = x_vec(j, slot, 4u) * NIBBLE_WEIGHT;
        c.b2 = x_vec(j, slot, 5u) * NIBBLE_WEIGHT;
        c.a3 = x_vec(j, slot, 6u) * NIBBLE_WEIGHT;
        c.b3 = x_vec(j, slot, 7u) * NIBBLE_WEIGHT;
    }
    return c;
}

// The workgroup copies the x of chunks j0 .. j0 + STEP - 1 (clamped to the last) to x_stage.
fn stage_x(j0: u32, chunks: u32, lane: u32) {
    workgroupBarrier();   // every lane has read the previous step's copy
    for (var q = lane; q < XV * STEP; q = q + LANES) {
        x_stage[(q % XV) * X_ROW + q / XV] = x_at(min(XV * j0 + q, XV * chunks - 1u));
    }
    workgroupBarrier();
}

// acc + chunk j's block dotted with x, if j is one of the row's chunks
fn accumulate(acc: Acc, b: Block, j: u32, slot: u32, chunks: u32) -> Acc {
    let ok = j < chunks;
    let xc = load_x(min(j, chunks - 1u), slot);
    var r = acc;
    r.q0 = select(acc.q0, fma(quad_dot(b.q0, xc), b.s.q0, acc.q0), ok);
    if (QUADS > 1u) {
        r.q1 = select(acc.q1, fma(quad_dot(b.q1, xc), b.s.q1, acc.q1), ok);
    }
    if (QUADS > 2u) {
        r.q2 = select(acc.q2, fma(quad_dot(b.q2, xc), b.s.q2, acc.q2), ok);
        r.q3 = select(acc.q3, fma(quad_dot(b.q3, xc), b.s.q3, acc.q3), ok);
    }
    return r;
}

fn column_rows(n0: u32, chunks: u32) -> Rows {
    let last = vec4<u32>(p.n - 1u);
    let c = vec4<u32>(n0) + vec4<u32>(0u, 1u, 2u, 3u);
    return Rows(min(c, last) * chunks, min(c + 4u, last) * chunks, min(c + 8u, last) * chunks,
                min(c + 12u, last) * chunks);
}

// This lane's share of columns n0 .. n0 + COLS - 1 (n0 a multiple of COLS, below N). Quads
// past n_pad read the scales of the last one. The loop is uniform (X_STAGED's barriers), and
// so is the call of begin_x (its barriers), made once the first step's weight loads are
// issued so that the prologue's own loads and barriers wait under theirs.
fn lane_partials(n0: u32, lane: u32) -> Acc {
    let chunks = p.k_words / WORDS;
    let rows = column_rows(n0, chunks);
    let sq = min(vec4<u32>(n0 / 4u) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n_pad / 4u - 1u));
    let last = chunks - 1u;
    var acc = Acc();
    for (var j0 = 0u; j0 < chunks; j0 = j0 + STEP) {
        let j = j0 + lane;
        let b0 = load_block(rows, sq, min(j, last));
        var b1: Block;
        var b2: Block;
        var b3: Block;
        if (UNROLL > 1u) {
            b1 = load_block(rows, sq, min(j + LANES, last));
        }
        if (UNROLL > 2u) {
            b2 = load_block(rows, sq, min(j + 2u * LANES, last));
            b3 = load_block(rows, sq, min(j + 3u * LANES, last));
        }
        if (j0 == 0u) {
            begin_x(lane);
        }
        if (X_STAGED) {
            stage_x(j0, chunks, lane);
        }
        acc = accumulate(acc, b0, j, lane, chunks);
        if (UNROLL > 1u) {
            acc = accumulate(acc, b1, j + LANES, lane + LANES, chunks);
        }
        if (UNROLL > 2u) {
            acc = accumulate(acc, b2, j + 2u * LANES, lane + 2u * LANES, chunks);
            acc = accumulate(acc, b3, j + 3u * LANES, lane + 3u * LANES, chunks);
        }
    }
    return acc;
}

// columns n0 + c and n0 + c + 1 (c even) of the one row, those below N: the lane that stores
// a pair holds both, as the SwiGLU epilogue needs (q4gsw_epilogue_swiglu.wgsl)
fn store_columns(n0: u32, c: u32, a: f32, b: f32) {
    if (n0 + c < p.n) {
        store_pair(0u, n0 + c, a, b);
    }
}

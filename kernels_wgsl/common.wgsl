// Shared by every kernel family (prepended by kernels_wgsl.source).

// The executor folds workgroup counts above 65,535 into a 2-D grid; this undoes the fold.
fn wg_linear(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// Dim d of a rank-8 vector packed as two vec4s (uniform arrays need 16-byte elements).
fn at8(v: array<vec4<u32>, 2>, d: u32) -> u32 {
    return v[d / 4u][d % 4u];
}

// Offset of linear element i of `shape` (rank dims, row-major) under `strides`.
fn strided_offset(i: u32, rank: u32, shape: array<vec4<u32>, 2>, strides: array<vec4<u32>, 2>) -> u32 {
    var rem = i;
    var off = 0u;
    for (var d = i32(rank) - 1; d >= 0; d = d - 1) {
        let size = at8(shape, u32(d));
        off = off + (rem % size) * at8(strides, u32(d));
        rem = rem / size;
    }
    return off;
}

// One strided copy over the linear index i of `shape` (shape.wgsl's family; rope_cache's
// cache writes): dst[dst_offset + offset(i, dst_strides)] = src[src_offset + offset(i, src_strides)].
struct CopyParams {
    n: u32,
    rank: u32,
    src_offset: u32,
    dst_offset: u32,
    shape: array<vec4<u32>, 2>,
    src_strides: array<vec4<u32>, 2>,
    dst_strides: array<vec4<u32>, 2>,
}

// (source, destination) element offsets of linear index i of copy c.
fn copy_offsets(i: u32, c: CopyParams) -> vec2<u32> {
    return vec2<u32>(c.src_offset + strided_offset(i, c.rank, c.shape, c.src_strides),
                     c.dst_offset + strided_offset(i, c.rank, c.shape, c.dst_strides));
}

// IEEE special values and tests on the bits: WGSL lets compilers assume no NaN or Inf in
// float arithmetic (so `x != x` may fold to false) and lets max/min/clamp drop a NaN operand,
// while torch propagates NaN. Kernels whose torch op propagates it say so with these.
fn f32_nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

fn f32_inf() -> f32 {
    return bitcast<f32>(0x7f800000u);
}

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn is_inf(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u;
}

// r, unless x is NaN: then x itself (its payload and sign), as torch's NaN-propagating ops do.
fn keep_nan(r: f32, x: f32) -> f32 {
    return select(r, x, is_nan(x));
}

// max and min that return a NaN operand (torch.maximum / torch.minimum semantics).
fn max_nan(a: f32, b: f32) -> f32 {
    return keep_nan(keep_nan(max(a, b), b), a);
}

fn min_nan(a: f32, b: f32) -> f32 {
    return keep_nan(keep_nan(min(a, b), b), a);
}

// 1/sqrt(ms) with IEEE's ends written out (WGSL leaves inverseSqrt of Inf and NaN undefined):
// a row holding Inf gives 0 (so its finite elements give 0, the Inf NaN, as torch), NaN stays.
// rms_norm's, in normalization.wgsl and in the q4gsw GEMV's fused-norm prologue.
fn rsqrt_of(ms: f32) -> f32 {
    return keep_nan(select(inverseSqrt(ms), 0.0, is_inf(ms)), ms);
}

// ss + the sum of v's squares, every product an explicit fma or its addend, so that no
// compiler contraction is left open: rms_norm's partial sums (normalization.wgsl) and the
// GEMV prologue that recomputes them (q4gsw_prologue_norm.wgsl) get the same bits.
fn add_squares4(ss: f32, v: vec4<f32>) -> f32 {
    return ss + (fma(v.y, v.y, v.x * v.x) + fma(v.w, v.w, v.z * v.z));
}

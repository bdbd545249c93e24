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

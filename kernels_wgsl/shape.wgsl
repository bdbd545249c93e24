// The copy family: permute, expand, slice, select, cat and split are all one strided copy,
//   dst[dst_offset + offset(i, dst_strides)] = src[src_offset + offset(i, src_strides)]
// over the linear index i of `shape` (CopyParams, copy_offsets: common.wgsl). Elements move
// as u32 bits so copies are exact.
// cast and copy convert each element from kind SRC to kind DST on the way (KIND_<NAME>,
// kernels_wgsl.KIND_PRELUDE), as torch converts: bool -> 0 / 1, to bool x != 0 (NaN and -0
// tested on the bits: NaN is true, -0 false), float -> int truncates toward 0.
//
// Entry `strided_copy_pair` is two copies in one grid (slice_scatter_pair: a layer's k and v
// cache writes): invocations [0, a.n) copy src -> dst by `a`, the next b.n copy src1 -> dst1
// by `b`. Both go through copy_offsets(), so each element moves exactly as its own copy.

override SRC: u32 = 0u;
override DST: u32 = 0u;   // == SRC: the bits as they are

struct CopyPair {
    a: CopyParams,
    b: CopyParams,
}

// Binding 0 is each entry point's own params (an entry point uses only its own).
@group(0) @binding(0) var<uniform> p: CopyParams;       // strided_copy
@group(0) @binding(0) var<uniform> pair: CopyPair;      // strided_copy_pair
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
@group(0) @binding(3) var<storage, read> src1: array<u32>;          // strided_copy_pair's second
@group(0) @binding(4) var<storage, read_write> dst1: array<u32>;

fn converted(bits: u32) -> u32 {
    if (SRC == DST || (SRC == KIND_BOOL && DST == KIND_I32)) {
        return bits;
    }
    if (DST == KIND_BOOL) {
        return holds(truth(bits, SRC));
    }
    if (DST == KIND_F32) {
        return bitcast<u32>(f32(bitcast<i32>(bits)));
    }
    return bitcast<u32>(i32(bitcast<f32>(bits)));
}

@compute @workgroup_size(256)
fn strided_copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    let o = copy_offsets(i, p);
    dst[o.y] = converted(src[o.x]);
}

@compute @workgroup_size(256)
fn strided_copy_pair(@builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < pair.a.n) {
        let o = copy_offsets(i, pair.a);
        dst[o.y] = converted(src[o.x]);
        return;
    }
    let e = i - pair.a.n;
    if (e < pair.b.n) {
        let o = copy_offsets(e, pair.b);
        dst1[o.y] = converted(src1[o.x]);
    }
}


// Advanced indexing (delegate/ops/indexing.py): one thread per output element i,
//   out[i] = x[ sum_d coord_d(i) * x_strides[d] + sum_j wrap_j(idx_j[at_j(i)]) * dim_stride[j] ]
// where coord_d(i) are i's coordinates in the output, x_strides walk the dims x keeps (0 along
// the index block), at_j(i) is the element of index tensor j broadcast into the block (its
// strides, 0 outside it) and wrap_j(v) = v + dim_size[j] for a negative v (only with p.wrap:
// index_select takes none). An index outside [-dim_size[j], dim_size[j]) ([0, dim_size[j])
// without wrap) makes the element 0 and nothing is read. Indices arrive as i32 (the
// executor holds int64 as i32); elements move as u32 bits, so the gather is exact for every dtype.
// MAX_INDICES (kernels_wgsl/indexing.py, in the prelude) is the number of index bindings below.

struct IndexParams {
    n: u32,
    rank: u32,
    count: u32,   // index tensors bound, <= MAX_INDICES
    wrap: u32,    // 1: a negative index counts from the end
    shape: array<vec4<u32>, 2>,
    x_strides: array<vec4<u32>, 2>,
    index_strides: array<array<vec4<u32>, 2>, MAX_INDICES>,
    dim_stride: vec4<u32>,   // x's stride along the dim index tensor j picks
    dim_size: vec4<u32>,     // and that dim's size
}

@group(0) @binding(0) var<uniform> p: IndexParams;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read> idx0: array<i32>;   // an unused slot binds x
@group(0) @binding(3) var<storage, read> idx1: array<i32>;
@group(0) @binding(4) var<storage, read> idx2: array<i32>;
@group(0) @binding(5) var<storage, read> idx3: array<i32>;
@group(0) @binding(6) var<storage, read_write> out: array<u32>;

fn index_value(j: u32, at: u32) -> i32 {
    switch j {
        case 0u: { return idx0[at]; }
        case 1u: { return idx1[at]; }
        case 2u: { return idx2[at]; }
        default: { return idx3[at]; }
    }
}

@compute @workgroup_size(256)
fn index_gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    var offset = strided_offset(i, p.rank, p.shape, p.x_strides);
    var inside = true;
    for (var j = 0u; j < p.count; j = j + 1u) {
        let size = p.dim_size[j];
        var v = index_value(j, strided_offset(i, p.rank, p.shape, p.index_strides[j]));
        v = select(v, v + i32(size), v < 0 && p.wrap != 0u);
        inside = inside && v >= 0 && u32(v) < size;
        offset = offset + u32(max(v, 0)) * p.dim_stride[j];
    }
    var bits = 0u;
    if (inside) {
        bits = x[offset];
    }
    out[i] = bits;
}

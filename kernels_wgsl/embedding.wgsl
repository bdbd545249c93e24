// Embedding gather: out[i, c] = weight[indices[i], c]. Indices arrive as i32 (the executor
// narrows int64 on upload); rows move as u32 bits so the copy is exact. An index outside
// [0, vocab) writes zeros rather than reading another row.

struct EmbeddingParams {
    n: u32,       // number of output elements
    dim: u32,     // embedding width
    vocab: u32,
}

@group(0) @binding(0) var<uniform> p: EmbeddingParams;
@group(0) @binding(1) var<storage, read> weight: array<u32>;
@group(0) @binding(2) var<storage, read> indices: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(256)
fn embedding(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    let row = indices[i / p.dim];
    var v = 0u;
    if (row >= 0 && u32(row) < p.vocab) {
        v = weight[u32(row) * p.dim + i % p.dim];
    }
    out[i] = v;
}

// embedding_q4gsw: out[i, d] = (q[row, d]) * scales[d / gs, row], row = indices[i / D], with
// q = ((packed[row * D/8 + d/8] >> 4*(d%8)) & 0xF) - 8 (linear_q4gsw's layout). A row outside
// [0, vocab) writes zeros.
struct Q4EmbeddingParams {
    n: u32, dim: u32, vocab: u32, group_size: u32,
    v_pad: u32,
}

@group(0) @binding(0) var<uniform> q4p: Q4EmbeddingParams;
@group(0) @binding(1) var<storage, read> packed: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<f32>;
@group(0) @binding(3) var<storage, read> q4_indices: array<i32>;
@group(0) @binding(4) var<storage, read_write> q4_out: array<f32>;

@compute @workgroup_size(256)
fn embedding_q4gsw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= q4p.n) {
        return;
    }
    let row = q4_indices[i / q4p.dim];
    let d = i % q4p.dim;
    var v = 0.0;
    if (row >= 0 && u32(row) < q4p.vocab) {
        let r = u32(row);
        let word = packed[r * (q4p.dim / 8u) + d / 8u];
        let q = f32((word >> (4u * (d % 8u))) & 0xFu) - 8.0;
        v = q * scales[(d / q4p.group_size) * q4p.v_pad + r];
    }
    q4_out[i] = v;
}

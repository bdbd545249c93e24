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

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

// embedding_bag: out[b, d] = sum / mean / max over the bag's entries j in [offsets[b], end) of
// weight[indices[j], d], end = offsets[b + 1] or, for the last bag, the number of indices.
// An entry equal to padding_idx, or outside [0, vocab), is skipped (and not counted in a
// mean); an empty bag writes 0. max keeps the first entry unless a later one is larger, as
// torch's CPU kernel does. One thread per output element.
struct BagParams {
    n: u32,          // bags * dim
    dim: u32,
    vocab: u32,
    n_indices: u32,
    n_offsets: u32,
    mode: u32,       // 0 sum, 1 mean, 2 max
    padding_idx: i32,
}

@group(0) @binding(0) var<uniform> bp: BagParams;
@group(0) @binding(1) var<storage, read> bag_weight: array<f32>;
@group(0) @binding(2) var<storage, read> bag_indices: array<i32>;
@group(0) @binding(3) var<storage, read> bag_offsets: array<i32>;
@group(0) @binding(4) var<storage, read_write> bag_out: array<f32>;

fn bag_bound(k: u32) -> u32 {
    if (k >= bp.n_offsets) { return bp.n_indices; }
    return u32(clamp(bag_offsets[k], 0, i32(bp.n_indices)));
}

@compute @workgroup_size(256)
fn embedding_bag(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= bp.n) {
        return;
    }
    let b = i / bp.dim;
    let d = i % bp.dim;
    let start = bag_bound(b);
    let end = max(start, bag_bound(b + 1u));
    var acc = 0.0;
    var count = 0u;
    for (var j = start; j < end; j = j + 1u) {
        let row = bag_indices[j];
        if (row == bp.padding_idx || row < 0 || u32(row) >= bp.vocab) {
            continue;
        }
        let v = bag_weight[u32(row) * bp.dim + d];
        if (bp.mode == 2u) {
            acc = select(acc, v, count == 0u || v > acc);
        } else {
            acc = acc + v;
        }
        count = count + 1u;
    }
    if (bp.mode == 1u && count > 0u) {
        acc = acc / f32(count);
    }
    bag_out[i] = acc;
}

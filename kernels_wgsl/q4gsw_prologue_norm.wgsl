// The prologue of the q4gsw GEMV for a fused RMSNorm (linear_q4gsw_multi / _swiglu with
// norm_eps, delegate/passes/rms_norm_linear.py): x holds the norm's input, and the GEMV reads
//   x_at(q) = (x[q] * rstd) * w[q],   rstd = rsqrt_of(sum(x^2) / K + eps)
// so the norm costs no dispatch. Each workgroup recomputes rstd in begin_x(): the rms_norm
// kernel's 128 partials (normalization.wgsl: partial t sums the squares of vec4s t, t + 128, ..
// in order, by common.wgsl's add_squares4), added in its halving tree, divided by K, plus eps,
// through rsqrt_of, and then its two products in its order: the unfused rms_norm's bits. A lane
// holds partials lane, lane + LANES, .. (PARTS of them) and issues their loads together.
// The prelude (kernels_wgsl/q4gsw.py, gemv_prologue) sets NORM_K (K) and norm_eps().

@group(0) @binding(7) var<storage, read> norm_weight: array<vec4<f32>>;

const NORM_WG: u32 = 128u;                          // rms_norm's workgroup: its partials
const NORM_VECS: u32 = NORM_K / 4u;
const PARTS: u32 = max(1u, NORM_WG / LANES);       // partials per lane: 1, 2 or 4
var<workgroup> norm_red: array<f32, NORM_WG>;
var<private> norm_rstd: f32;

fn begin_x(lane: u32) {
    var ss = vec4<f32>();   // component u: partial lane + u * LANES
    for (var i0 = 0u; i0 < NORM_VECS; i0 = i0 + NORM_WG) {
        for (var u = 0u; u < PARTS; u = u + 1u) {
            let t = lane + u * LANES;
            if (t < NORM_WG && i0 + t < NORM_VECS) {
                ss[u] = add_squares4(ss[u], x[i0 + t]);
            }
        }
    }
    for (var u = 0u; u < PARTS; u = u + 1u) {
        if (lane + u * LANES < NORM_WG) {
            norm_red[lane + u * LANES] = ss[u];
        }
    }
    workgroupBarrier();
    for (var s = NORM_WG / 2u; s > 0u; s = s / 2u) {
        for (var t = lane; t < s; t = t + LANES) {
            norm_red[t] = norm_red[t] + norm_red[t + s];
        }
        workgroupBarrier();
    }
    norm_rstd = rsqrt_of(norm_red[0] / f32(p.k) + norm_eps());
}

fn x_at(q: u32) -> vec4<f32> {
    return x[q] * norm_rstd * norm_weight[q];
}

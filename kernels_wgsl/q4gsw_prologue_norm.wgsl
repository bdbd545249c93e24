// The prologue of the q4gsw GEMV for a fused RMSNorm (linear_q4gsw_multi / _swiglu with
// norm_eps, delegate/passes/rms_norm_linear.py): x holds the norm's input, and the GEMV reads
//   x_at(q) = (x[q] * rstd) * w[q],   rstd = rsqrt_of(sum(x^2) / K + eps)
// so the norm costs no dispatch. Each workgroup recomputes rstd in begin_x(): the rms_norm
// kernel's 128 partials (normalization.wgsl: partial t sums the squares of vec4s t, t + 128, ..
// in order, by common.wgsl's add_squares4), added in its halving tree, divided by K, plus eps,
// through rsqrt_of, and then its two products in its order: the unfused rms_norm's bits.
// The prelude (kernels_wgsl/q4gsw.py, Norm.gemv_prologue) sets NORM_WG (NORM_PARTIALS: the
// rms_norm kernel's workgroup, its partials and its tree), norm_eps() and
// norm_partials(lane), which stores the partials lane, lane + LANES, .. (those below 128) in
// norm_red: generated for this K and LANES with every load of x issued before the first sum
// (a loop of conditional loads ran them one after another: on an H100 the QKV GEMV took 8 us
// longer with it, the SwiGLU GEMV 15 us).

@group(0) @binding(7) var<storage, read> norm_weight: array<vec4<f32>>;

var<workgroup> norm_red: array<f32, NORM_WG>;
var<private> norm_rstd: f32;

fn begin_x(lane: u32) {
    norm_partials(lane);
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

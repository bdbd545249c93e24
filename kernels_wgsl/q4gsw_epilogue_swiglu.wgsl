// The epilogue of the q4gsw GEMV and 128x128 GEMM for linear_q4gsw_swiglu (the gate/up pair of
// an MLP and its SwiGLU product, delegate/passes/linear_swiglu.py). The weight holds the gate's
// and the up's rows interleaved, so columns 2j and 2j + 1 are gate_j and up_j, and a kernel
// stores them as one pair (store_pair, n even) from the thread that computed both:
//   out[m, j] = g * sigmoid(g) * u,   g = y[m, 2j], u = y[m, 2j + 1],   out [M, N / 2]
// the expression of silu_mul's WGSL (elementwise.wgsl, sigmoid(x) = 1 / (1 + exp(-x))) in the
// same order, so the fused output has the bits of the linear followed by silu_mul. The 64x64
// GEMM gives a thread columns 16 apart, not pairs: it is not built with this file.

@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// columns n (a gate, n even) and n + 1 (its up) of row m
fn store_pair(m: u32, n: u32, g: f32, u: f32) {
    out[m * (p.n / 2u) + n / 2u] = g * (1.0 / (1.0 + exp(-g))) * u;
}

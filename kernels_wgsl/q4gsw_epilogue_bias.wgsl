// The epilogue of the q4gsw GEMMs and GEMV for linear_q4gsw: one output, an optional bias and
// an optional residual (delegate/passes/residual_add.py folds `linear(x) + r` into the op):
//   out[m, n] = (y + bias[n]) + residual[m, n]
// in f32 and in that order, the unfused linear's rounding then the unfused add's, so a fused
// output has the bits of the linear followed by its add. residual is [..., N] like out; each
// invocation reads residual[i] before it writes out[i], and no other, so even a residual in
// out's own bytes would be safe (the planner gives them distinct buffers anyway).
// kernels_wgsl/q4gsw.py puts this file, q4gsw_epilogue_split.wgsl (the fused multi-output op)
// or q4gsw_epilogue_swiglu.wgsl into the kernel's prelude: the tile and GEMV bodies call
// store_output() or store_pair() and are shared.

override HAS_BIAS: bool = false;
override HAS_RESIDUAL: bool = false;

@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read> residual: array<f32>;

// column n < N of row m
fn store_output(m: u32, n: u32, y: f32) {
    let i = m * p.n + n;
    var v = y;
    if (HAS_BIAS) {
        v = v + bias[n];
    }
    if (HAS_RESIDUAL) {
        v = v + residual[i];
    }
    out[i] = v;
}

// columns n and n + 1 of row m, the second only if below N
fn store_pair(m: u32, n: u32, a: f32, b: f32) {
    store_output(m, n, a);
    if (n + 1u < p.n) {
        store_output(m, n + 1u, b);
    }
}

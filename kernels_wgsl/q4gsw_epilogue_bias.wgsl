// The epilogue of the q4gsw GEMMs and GEMV for linear_q4gsw: one output, an optional bias.
//   out[m, n] = y + bias[n]
// kernels_wgsl/q4gsw.py puts this file, or q4gsw_epilogue_split.wgsl (the fused multi-output
// op), into the kernel's prelude: the tile and GEMV bodies call store_output() and are shared.

override HAS_BIAS: bool = false;

@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

// column n < N of row m
fn store_output(m: u32, n: u32, y: f32) {
    var v = y;
    if (HAS_BIAS) {
        v = v + bias[n];
    }
    out[m * p.n + n] = v;
}

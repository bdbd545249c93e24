// The epilogue of the q4gsw GEMMs and GEMV for linear_q4gsw_multi (fused q/k/v or gate/up):
// the weight is the outputs' weights concatenated along N, and column n is scattered to the
// output whose range holds it, each output row-major [M, its width]:
//   [0, N0) -> out0,   [N0, N0 + N1) -> out1,   [N0 + N1, N) -> out2 (empty for a pair)
// No bias: the pass fuses only bias-free linears. Written where the unfused op would write it,
// so every column's value is the unfused one's.

override N0: u32;
override N1: u32;

@group(0) @binding(4) var<storage, read_write> out0: array<f32>;
@group(0) @binding(5) var<storage, read_write> out1: array<f32>;
@group(0) @binding(6) var<storage, read_write> out2: array<f32>;   // a pair binds a dummy

// column n < N of row m
fn store_output(m: u32, n: u32, y: f32) {
    if (n < N0) {
        out0[m * N0 + n] = y;
    } else if (n < N0 + N1) {
        out1[m * N1 + (n - N0)] = y;
    } else {
        out2[m * (p.n - N0 - N1) + (n - N0 - N1)] = y;
    }
}

// columns n and n + 1 of row m, the second only if below N
fn store_pair(m: u32, n: u32, a: f32, b: f32) {
    store_output(m, n, a);
    if (n + 1u < p.n) {
        store_output(m, n + 1u, b);
    }
}

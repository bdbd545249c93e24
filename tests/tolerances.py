"""The one table of numerical tolerances. Every kernel test compares against an independent
float64 reference and takes its (rtol, atol) from here, keyed by op family and executor."""

# family -> {executor: (rtol, atol)}; float32 kernels vs float64 eager references.
TOLERANCES = {
    "elementwise":      {"cpu": (1e-6, 1e-6), "webgpu": (1e-5, 1e-5)},
    "transcendental":   {"cpu": (1e-5, 1e-6), "webgpu": (1e-4, 1e-5)},  # exp, tanh, gelu, ...
    # results near 0 that must stay relatively accurate: log1p of tiny x, where log(1 + x)
    # in float32 is off by up to 100% (1 + x rounds x's low bits away)
    "transcendental-relative": {"cpu": (1e-6, 0.0), "webgpu": (1e-5, 0.0)},
    "matmul":           {"cpu": (1e-5, 1e-5), "webgpu": (1e-4, 1e-4)},
    "softmax":          {"cpu": (1e-5, 1e-6), "webgpu": (1e-4, 1e-5)},
    "normalization":    {"cpu": (1e-5, 1e-5), "webgpu": (1e-4, 1e-4)},
    "shape":            {"cpu": (0.0, 0.0),   "webgpu": (0.0, 0.0)},    # exact copies
    "embedding":        {"cpu": (0.0, 0.0),   "webgpu": (0.0, 0.0)},
    "attention":        {"cpu": (1e-5, 1e-5), "webgpu": (1e-4, 1e-4)},
    # float32 sums of up to ~1e4 terms (lanes, then a tree): error grows ~ sqrt(N) ulp; amax,
    # amin and max pooling are exact, var is two-pass (mean, then squared deviations)
    "reduction":        {"cpu": (1e-5, 1e-5), "webgpu": (1e-5, 1e-5)},
    # cumsum: webgpu adds a line in order in f32 (k-th sum: ~k ulp of sum |x|); cpu is torch's
    "cumsum":           {"cpu": (1e-6, 1e-6), "webgpu": (1e-5, 1e-5)},
    # a window of at most a few hundred terms: sums and interpolations, like elementwise
    "pooling":          {"cpu": (1e-5, 1e-5), "webgpu": (1e-5, 1e-5)},
    # outputs and final states, relative to max |reference| (issue: within 1e-4 relative).
    # webgpu: lavapipe measures <= 2e-6; Vulkan lets exp be off by 3 + 2|x| ulp, about 1e-5
    # at the chunked route's |log Γ| <= 80, so 1e-4 keeps a 10x margin on real GPUs
    "gated_delta_rule": {"cpu": (1e-4, 1e-4), "webgpu": (1e-4, 1e-4)},
    # 4-bit weights vs an fp64 dequantize-then-matmul. webgpu rounds activations to f16 for
    # the GEMM's multiply (2^-11 relative) and accumulates in f32; webgpu-f32 is its f32 variant
    # and the f32 GEMV
    "q4gsw":            {"cpu": (1e-5, 1e-5), "webgpu": (4e-3, 8e-3), "webgpu-f32": (1e-4, 1e-4)},
    # whole models through the runner vs eager float32 PyTorch
    "model":            {"cpu": (1e-4, 1e-4), "webgpu": (1e-3, 1e-3)},
}


def tol(family: str, executor: str = "cpu") -> dict:
    rtol, atol = TOLERANCES[family][executor]
    return {"rtol": rtol, "atol": atol}

// Elementwise ops. OP (an override constant) picks the function, so each op compiles to its
// own specialised pipeline from this one source.

override OP: u32 = 0u;
override HAS_B: bool = true;   // false: the second operand is the scalar p.other

struct BinaryParams {
    n: u32,
    rank: u32,
    alpha: f32,
    other: f32,
    shape: array<vec4<u32>, 2>,
    a_strides: array<vec4<u32>, 2>,
    b_strides: array<vec4<u32>, 2>,
}

struct UnaryParams {
    n: u32,
    exponent: f32,
}

@group(0) @binding(0) var<uniform> bp: BinaryParams;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// add = a + alpha*b, sub = a - alpha*b, mul, div; b broadcast through zero strides.
@compute @workgroup_size(256)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= bp.n) {
        return;
    }
    let x = a[strided_offset(i, bp.rank, bp.shape, bp.a_strides)];
    var y = bp.other;
    if (HAS_B) {
        y = b[strided_offset(i, bp.rank, bp.shape, bp.b_strides)];
    }
    var r: f32;
    switch OP {
        case 0u: { r = x + bp.alpha * y; }
        case 1u: { r = x - bp.alpha * y; }
        case 2u: { r = x * y; }
        default: { r = x / y; }
    }
    out[i] = r;
}

@group(0) @binding(0) var<uniform> up: UnaryParams;
@group(0) @binding(1) var<storage, read> ux: array<f32>;
@group(0) @binding(2) var<storage, read_write> uout: array<f32>;

// tanh as 1 - 2/(e^{2|x|} + 1) overflows nowhere (a naive (e^2x-1)/(e^2x+1) gives inf/inf).
fn safe_tanh(x: f32) -> f32 {
    let e = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - e) / (1.0 + e);
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7); WGSL has no erf.
fn erf_as(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
               + t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - poly * exp(-x * x));
}

// x^e for a scalar e; WGSL pow is undefined for x < 0, so odd/even integer e take the sign.
fn pow_scalar(x: f32, e: f32) -> f32 {
    if (e == 2.0) {
        return x * x;
    }
    if (e == 1.0) {
        return x;
    }
    if (e == 0.5) {
        return sqrt(x);
    }
    let m = pow(abs(x), e);
    if (x >= 0.0) {
        return m;
    }
    if (e != floor(e)) {
        return bitcast<f32>(0x7fc00000u);   // NaN, as torch gives
    }
    return select(m, -m, (i32(e) & 1) == 1);
}

@compute @workgroup_size(256)
fn unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= up.n) {
        return;
    }
    let x = ux[i];
    var r: f32;
    switch OP {
        case 0u: { r = -x; }
        case 1u: { r = exp(x); }
        case 2u: { r = sigmoid(x); }
        case 3u: { r = max(x, 0.0); }
        case 4u: { r = safe_tanh(x); }
        case 5u: { r = inverseSqrt(x); }
        case 6u: { r = x * sigmoid(x); }
        case 7u: { r = 0.5 * x * (1.0 + erf_as(x * 0.70710678118654752)); }
        case 8u: { r = 0.5 * x * (1.0 + safe_tanh(0.79788456080286536 * (x + 0.044715 * x * x * x))); }
        default: { r = pow_scalar(x, up.exponent); }
    }
    uout[i] = r;
}

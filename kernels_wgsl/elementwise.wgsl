// Elementwise ops. OP (an override constant) picks the function, so each op compiles to its
// own specialised pipeline from this one source. The OP_<NAME> codes are `const`s that
// kernels_wgsl/elementwise.py generates into the prelude from its op table.
//
// NaN and Inf follow torch's CPU kernels: an op torch computes with NaN-propagating
// max/min/comparisons says so explicitly (keep_nan, max_nan in common.wgsl), and the builtins
// whose result WGSL leaves undefined at 0, < 0 or Inf (inverseSqrt, sqrt, log, pow, sin) get
// those points written out.

override OP: u32 = 0u;
override HAS_B: bool = true;   // false: the second operand is the scalar p.other
// Binary operands are read as u32 bits and decoded by their kind (KIND_<NAME>,
// kernels_wgsl.KIND_PRELUDE: f32, or i32 holding int32 / int64 / bool 0 / 1). FLOAT_MATH
// (elementwise.py decides it as torch promotes: a float operand, or div) computes in f32,
// otherwise in i32, which wraps as torch's int32 does. A scalar `other` and alpha come as the
// bits of the type the op computes in; a scalar's B_KIND says that type.
override A_KIND: u32 = 0u;
override B_KIND: u32 = 0u;
override FLOAT_MATH: bool = true;

struct BinaryParams {
    n: u32,
    rank: u32,
    alpha: u32,
    other: u32,
    shape: array<vec4<u32>, 2>,
    a_strides: array<vec4<u32>, 2>,
    b_strides: array<vec4<u32>, 2>,
}

// s0..s2: the op's scalars, as elementwise.py's table packs them (pow: exponent;
// clamp: min, max; leaky_relu: slope; elu: alpha, scale, input_scale).
struct UnaryParams {
    n: u32,
    s0: f32,
    s1: f32,
    s2: f32,
}

@group(0) @binding(0) var<uniform> bp: BinaryParams;
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

// add = a + alpha*b, sub = a - alpha*b, mul, div, silu_mul = a * sigmoid(a) * b (SwiGLU:
// gate a, up b).
fn binary_f32(x: f32, y: f32, alpha: f32) -> f32 {
    switch OP {
        case OP_ADD: { return x + alpha * y; }
        case OP_SUB: { return x - alpha * y; }
        case OP_MUL: { return x * y; }
        case OP_SILU_MUL: { return x * sigmoid(x) * y; }
        default: { return x / y; }
    }
}

// add, sub and mul: the ops the registry lets compute in integers.
fn binary_i32(x: i32, y: i32, alpha: i32) -> i32 {
    switch OP {
        case OP_ADD: { return x + alpha * y; }
        case OP_SUB: { return x - alpha * y; }
        default: { return x * y; }
    }
}

// b broadcast through zero strides.
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
    if (FLOAT_MATH) {
        let r = binary_f32(as_f32(x, A_KIND), as_f32(y, B_KIND), bitcast<f32>(bp.alpha));
        out[i] = bitcast<u32>(r);
    } else {
        let r = binary_i32(bitcast<i32>(x), bitcast<i32>(y), bitcast<i32>(bp.alpha));
        out[i] = bitcast<u32>(r);
    }
}

@group(0) @binding(0) var<uniform> up: UnaryParams;
@group(0) @binding(1) var<storage, read> ux: array<f32>;
@group(0) @binding(2) var<storage, read_write> uout: array<f32>;

fn sign_bit(x: f32) -> bool {
    return (bitcast<u32>(x) >> 31u) == 1u;
}

// +Inf, or -Inf when `negative`.
fn signed_inf(negative: bool) -> f32 {
    return select(f32_inf(), -f32_inf(), negative);
}

// tanh as 1 - 2/(e^{2|x|} + 1) overflows nowhere (a naive (e^2x-1)/(e^2x+1) gives inf/inf).
fn safe_tanh(x: f32) -> f32 {
    let e = exp(-2.0 * abs(x));
    return keep_nan(sign(x) * (1.0 - e) / (1.0 + e), x);
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7); WGSL has no erf.
fn erf_as(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
               + t * (-1.453152027 + t * 1.061405429))));
    return keep_nan(sign(x) * (1.0 - poly * exp(-x * x)), x);
}

// Exact gelu. torch's vectorized float32 kernel, which every tensor of more than one element
// takes, gives NaN at +Inf (its scalar and float64 paths give +Inf); we match the vectorized one.
fn gelu_erf(x: f32) -> f32 {
    let r = 0.5 * x * (1.0 + erf_as(x * 0.70710678118654752));
    return select(r, f32_nan(), x == f32_inf());
}

// e^u - 1 without the cancellation of exp(u) - 1 near 0 (4 Taylor terms, error < 1e-10 there).
fn expm1(u: f32) -> f32 {
    let taylor = u * (1.0 + u * (0.5 + u * (0.16666667 + u * 0.041666668)));
    return select(exp(u) - 1.0, taylor, abs(u) < 1e-2);
}

// 1/sqrt(x), sqrt(x) and ln(x) with IEEE's special points; WGSL leaves x <= 0 undefined.
fn rsqrt_ieee(x: f32) -> f32 {
    var r = select(inverseSqrt(x), 0.0, x == f32_inf());
    r = select(r, signed_inf(sign_bit(x)), x == 0.0);
    return keep_nan(select(r, f32_nan(), x < 0.0), x);
}

fn sqrt_ieee(x: f32) -> f32 {
    let r = select(sqrt(x), x, x == 0.0 || x == f32_inf());   // keeps -0 as -0
    return keep_nan(select(r, f32_nan(), x < 0.0), x);
}

fn log_ieee(x: f32) -> f32 {
    var r = select(log(x), f32_inf(), x == f32_inf());
    r = select(r, -f32_inf(), x == 0.0);
    return keep_nan(select(r, f32_nan(), x < 0.0), x);
}

// ln(1 + x); WGSL has no log1p. Near 0, log(1 + x) loses x's low bits to the rounding of 1 + x,
// and WGSL bounds log's error near 1 only absolutely (2^-21), so |x| < 1/4 takes the series
//   ln(1 + x) = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...),  s = x / (2 + x),  |s| < 1/7,
// whose terms past s^9/9 are below 1e-9 relative. Elsewhere 1 + x is exact or rounds harmlessly,
// and log_ieee gives -1 -> -Inf, x < -1 -> NaN, +Inf -> +Inf.
fn log1p_ieee(x: f32) -> f32 {
    if (abs(x) < 0.25) {
        let s = x / (2.0 + x);
        let s2 = s * s;
        return 2.0 * s * (1.0 + s2 * (1.0 / 3.0 + s2 * (0.2 + s2 * (1.0 / 7.0 + s2 / 9.0))));
    }
    return log_ieee(1.0 + x);
}

// x^e for a scalar e, as torch: e of 0.5 and -0.5 are sqrt and rsqrt (so a negative base, -Inf
// too, gives NaN); otherwise C's pow: e == 0 gives 1 even for NaN, a base of ±0 or ±Inf gives 0
// or Inf by the sign of e, a negative base takes the sign of an odd integer e and gives NaN for
// a non-integer one. WGSL's pow is defined only for x > 0, so it sees only |x|.
fn pow_scalar(x: f32, e: f32) -> f32 {
    if (e == 0.0) {
        return 1.0;
    }
    if (e == 0.5) {
        return sqrt_ieee(x);
    }
    if (e == -0.5) {
        return rsqrt_ieee(x);
    }
    if (e == 1.0 || is_nan(x)) {
        return x;
    }
    let ax = abs(x);
    var m = pow(ax, e);
    if (ax == 0.0 || ax == f32_inf()) {
        m = select(0.0, f32_inf(), (ax == 0.0) == (e < 0.0));
    } else if (e == 2.0) {
        m = ax * ax;
    }
    if (!sign_bit(x)) {
        return m;
    }
    if (e != floor(e)) {
        return select(f32_nan(), m, ax == 0.0 || ax == f32_inf());
    }
    let odd = abs(e) < 16777216.0 && (i32(e) & 1) == 1;
    return select(m, -m, odd);
}

// clamp with torch's order min(max(x, lo), hi); absent bounds arrive as -Inf / +Inf, and a NaN
// x or bound gives NaN.
fn clamp_nan(x: f32, lo: f32, hi: f32) -> f32 {
    return min_nan(max_nan(x, lo), hi);
}

// sin and cos after a Cody-Waite reduction into [-pi, pi], where WGSL bounds their error:
// 2*pi = C1 + C2 + C3 with C1 (8 bits) and C2 (12 bits) short enough that k*C1 and k*C2 are
// exact for |x| below about 2.5e4; beyond that the input's own rounding dominates.
fn reduce_angle(x: f32) -> f32 {
    let k = round(x * 0.15915494);
    return ((x - k * 6.28125) - k * 0.0019354820251464844) - k * -1.7484555314695172e-07;
}

fn sin_ieee(x: f32) -> f32 {
    return select(sin(reduce_angle(x)), f32_nan(), is_nan(x) || is_inf(x));
}

fn cos_ieee(x: f32) -> f32 {
    return select(cos(reduce_angle(x)), f32_nan(), is_nan(x) || is_inf(x));
}

fn unary_op(x: f32) -> f32 {
    switch OP {
        case OP_NEG: { return -x; }
        case OP_EXP: { return exp(x); }
        case OP_SIGMOID: { return sigmoid(x); }
        // torch relu is clamp_min(x, 0): NaN stays NaN and -0 stays -0
        case OP_RELU: { return keep_nan(select(x, 0.0, x < 0.0), x); }
        case OP_TANH: { return safe_tanh(x); }
        case OP_RSQRT: { return rsqrt_ieee(x); }
        case OP_SILU: { return x * sigmoid(x); }
        case OP_GELU: { return gelu_erf(x); }
        case OP_GELU_TANH: {
            return 0.5 * x * (1.0 + safe_tanh(0.79788456080286536 * (x + 0.044715 * x * x * x)));
        }
        case OP_POW: { return pow_scalar(x, up.s0); }
        case OP_ABS: { return abs(x); }
        case OP_SQRT: { return sqrt_ieee(x); }
        case OP_LOG: { return log_ieee(x); }
        case OP_LOG1P: { return log1p_ieee(x); }
        case OP_CEIL: { return keep_nan(ceil(x), x); }
        case OP_FLOOR: { return keep_nan(floor(x), x); }
        case OP_CLAMP: { return clamp_nan(x, up.s0, up.s1); }
        // torch: x > 0 ? x : x * slope (so NaN and 0 * -Inf give NaN)
        case OP_LEAKY_RELU: { return select(x * up.s0, x, x > 0.0); }
        // torch: x > 0 ? x * scale : alpha * scale * expm1(x * input_scale)
        case OP_ELU: { return select(up.s0 * up.s1 * expm1(x * up.s2), x * up.s1, x > 0.0); }
        // torch: x * clamp(x + 3, 0, 6) / 6 (so -Inf gives -Inf * 0 = NaN, as there)
        case OP_HARDSWISH: { return x * clamp_nan(x + 3.0, 0.0, 6.0) / 6.0; }
        case OP_HARDSIGMOID: { return clamp_nan(x + 3.0, 0.0, 6.0) / 6.0; }
        case OP_SIN: { return sin_ieee(x); }
        default: { return cos_ieee(x); }
    }
}

@compute @workgroup_size(256)
fn unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= up.n) {
        return;
    }
    uout[i] = unary_op(ux[i]);
}

@group(0) @binding(1) var<storage, read> ix: array<i32>;
@group(0) @binding(2) var<storage, read_write> iout: array<i32>;

// neg of int32 / int64 held as i32, the one unary op the registry runs on integers: -(-2^31)
// wraps to -2^31, as torch's int32 neg does.
@compute @workgroup_size(256)
fn neg_i32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= up.n) {
        return;
    }
    iout[i] = -ix[i];
}

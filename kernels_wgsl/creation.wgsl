// Creation kernels (delegate/ops/creation.py): arange, fill, triangle (triu / tril), cumsum.
// Elements are u32 bits decoded by kind (KIND_<NAME>, kernels_wgsl.KIND_PRELUDE): f32, i32
// (int32 and int64, which the executor holds as i32) or bool (0 / 1).

override KIND: u32 = 0u;       // the result's kind (cumsum: its input's is SRC_KIND)
override SRC_KIND: u32 = 0u;
override LOWER: bool = false;  // triangle: tril (keep c - r <= diagonal), else triu (>=)

// ---- arange: out[i] = start + i * step, in f32 or in i32 (wrapping) by KIND ------------------
struct RangeParams {
    n: u32,
    start: u32,   // bits of an f32 or an i32, as KIND says
    step: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> rp: RangeParams;
@group(0) @binding(1) var<storage, read_write> range_out: array<u32>;

@compute @workgroup_size(256)
fn arange(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= rp.n) {
        return;
    }
    if (KIND == KIND_F32) {
        range_out[i] = bitcast<u32>(fma(f32(i), bitcast<f32>(rp.step), bitcast<f32>(rp.start)));
    } else {
        range_out[i] = bitcast<u32>(bitcast<i32>(rp.start) + i32(i) * bitcast<i32>(rp.step));
    }
}

// ---- fill: every element the same bits ----------------------------------------------------------
struct FillParams {
    n: u32,
    bits: u32,
}

@group(0) @binding(0) var<uniform> fp: FillParams;
@group(0) @binding(1) var<storage, read_write> fill_out: array<u32>;

@compute @workgroup_size(256)
fn fill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < fp.n) {
        fill_out[i] = fp.bits;
    }
}

// ---- triangle: x[..., r, c] where c - r >= diagonal (triu; <= for tril), else bits 0 -----------
struct TriangleParams {
    n: u32,
    rows: u32,
    cols: u32,
    diagonal: i32,   // clamped to [-rows, cols] by the host: the same mask, and fits an i32
}

@group(0) @binding(0) var<uniform> tp: TriangleParams;
@group(0) @binding(1) var<storage, read> tri_in: array<u32>;
@group(0) @binding(2) var<storage, read_write> tri_out: array<u32>;

@compute @workgroup_size(256)
fn triangle(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= tp.n) {
        return;
    }
    let offset = i32(i % tp.cols) - i32((i / tp.cols) % tp.rows);
    let keep = select(offset >= tp.diagonal, offset <= tp.diagonal, LOWER);
    tri_out[i] = select(0u, tri_in[i], keep);
}

// ---- cumsum: one thread per line along the scanned dim, adding in order -----------------------
//   out[o, k, j] = sum_{k' <= k} x[o, k', j]      (o: outer dims, k: the dim, j: inner dims)
// each element converted to the result's kind first, as torch converts before it sums: bool and
// i32 to f32 or i32, f32 to i32 by truncation. A float line adds left to right in f32.
struct ScanParams {
    lines: u32,    // outer * inner
    length: u32,   // size of the scanned dim
    inner: u32,    // elements between two neighbours along it
    pad: u32,
}

@group(0) @binding(0) var<uniform> sp: ScanParams;
@group(0) @binding(1) var<storage, read> scan_in: array<u32>;
@group(0) @binding(2) var<storage, read_write> scan_out: array<u32>;

fn as_i32(bits: u32) -> i32 {
    return select(bitcast<i32>(bits), i32(bitcast<f32>(bits)), SRC_KIND == KIND_F32);
}

@compute @workgroup_size(256)
fn cumsum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let line = wg_linear(wid, nwg) * 256u + lid;
    if (line >= sp.lines) {
        return;
    }
    let base = (line / sp.inner) * sp.length * sp.inner + line % sp.inner;
    var f = 0.0;
    var n = 0i;
    for (var k = 0u; k < sp.length; k = k + 1u) {
        let at = base + k * sp.inner;
        if (KIND == KIND_F32) {
            f = f + as_f32(scan_in[at], SRC_KIND);
            scan_out[at] = bitcast<u32>(f);
        } else {
            n = n + as_i32(scan_in[at]);
            scan_out[at] = bitcast<u32>(n);
        }
    }
}

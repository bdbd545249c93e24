// 2-D pooling and upsampling over the last two dims, one thread per output element; planes
// (N * C) are independent. Source index rules follow ATen's CPU kernels:
//   pool window rows [oy * stride - pad, ...) stepping by dilation, clipped to the input;
//   adaptive rows [floor(oy * H / OH), ceil((oy + 1) * H / OH));
//   nearest: min(floor(oy * scale), H - 1); bilinear: src = (oy + 0.5) * scale - 0.5 clamped
//   at 0, or oy * scale with align_corners (scale then (H - 1) / (OH - 1)).

struct PoolParams {
    n_out: u32,
    ih: u32,
    iw: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
    flag: u32,        // avg_pool2d: count_include_pad; bilinear: align_corners
    _pad0: u32,
    _pad1: u32,
    scale_h: f32,
    scale_w: f32,
}

@group(0) @binding(0) var<uniform> p: PoolParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// (plane base offset in x, oy, ox) of output element i
fn coords(i: u32) -> vec3<u32> {
    let plane = i / (p.oh * p.ow);
    let r = i % (p.oh * p.ow);
    return vec3<u32>(plane * p.ih * p.iw, r / p.ow, r % p.ow);
}

fn index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return wg_linear(wid, nwg) * 64u + lid;
}

@compute @workgroup_size(64)
fn max_pool2d(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n_out) { return; }
    let c = coords(i);
    let y0 = i32(c.y * p.sh) - i32(p.ph);
    let x0 = i32(c.z * p.sw) - i32(p.pw);
    var m = -f32_inf();
    for (var ky = 0u; ky < p.kh; ky = ky + 1u) {
        let y = y0 + i32(ky * p.dh);
        if (y < 0 || y >= i32(p.ih)) { continue; }
        for (var kx = 0u; kx < p.kw; kx = kx + 1u) {
            let xx = x0 + i32(kx * p.dw);
            if (xx < 0 || xx >= i32(p.iw)) { continue; }
            m = max_nan(m, x[c.x + u32(y) * p.iw + u32(xx)]);
        }
    }
    out[i] = m;
}

// Sum of x over rows [y0, y1) and columns [x0, x1) of the plane at `base`.
fn window_sum(base: u32, y0: u32, y1: u32, x0: u32, x1: u32) -> f32 {
    var s = 0.0;
    for (var y = y0; y < y1; y = y + 1u) {
        for (var xx = x0; xx < x1; xx = xx + 1u) {
            s = s + x[base + y * p.iw + xx];
        }
    }
    return s;
}

@compute @workgroup_size(64)
fn avg_pool2d(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n_out) { return; }
    let c = coords(i);
    let hs = i32(c.y * p.sh) - i32(p.ph);
    let ws = i32(c.z * p.sw) - i32(p.pw);
    let he = min(hs + i32(p.kh), i32(p.ih + p.ph));
    let we = min(ws + i32(p.kw), i32(p.iw + p.pw));
    let padded_count = (he - hs) * (we - ws);
    let y0 = u32(max(hs, 0));
    let x0 = u32(max(ws, 0));
    let y1 = u32(min(he, i32(p.ih)));
    let x1 = u32(min(we, i32(p.iw)));
    let count = select(i32((y1 - y0) * (x1 - x0)), padded_count, p.flag != 0u);
    out[i] = window_sum(c.x, y0, y1, x0, x1) / f32(count);
}

@compute @workgroup_size(64)
fn adaptive_avg_pool2d(@builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n_out) { return; }
    let c = coords(i);
    let y0 = c.y * p.ih / p.oh;
    let y1 = ((c.y + 1u) * p.ih + p.oh - 1u) / p.oh;
    let x0 = c.z * p.iw / p.ow;
    let x1 = ((c.z + 1u) * p.iw + p.ow - 1u) / p.ow;
    out[i] = window_sum(c.x, y0, y1, x0, x1) / f32((y1 - y0) * (x1 - x0));
}

@compute @workgroup_size(64)
fn upsample_nearest2d(@builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n_out) { return; }
    let c = coords(i);
    let y = min(u32(floor(f32(c.y) * p.scale_h)), p.ih - 1u);
    let xx = min(u32(floor(f32(c.z) * p.scale_w)), p.iw - 1u);
    out[i] = x[c.x + y * p.iw + xx];
}

// (lower index, upper index, weight of the upper) of output coordinate o along one dim.
fn linear_src(o: u32, scale: f32, size: u32) -> vec3<f32> {
    var src = f32(o) * scale;
    if (p.flag == 0u) {
        src = max((f32(o) + 0.5) * scale - 0.5, 0.0);
    }
    let i0 = min(u32(src), size - 1u);
    let i1 = min(i0 + 1u, size - 1u);
    return vec3<f32>(f32(i0), f32(i1), src - f32(i0));
}

@compute @workgroup_size(64)
fn upsample_bilinear2d(@builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n_out) { return; }
    let c = coords(i);
    let h = linear_src(c.y, p.scale_h, p.ih);
    let w = linear_src(c.z, p.scale_w, p.iw);
    let r0 = c.x + u32(h.x) * p.iw;
    let r1 = c.x + u32(h.y) * p.iw;
    let top = (1.0 - w.z) * x[r0 + u32(w.x)] + w.z * x[r0 + u32(w.y)];
    let bottom = (1.0 - w.z) * x[r1 + u32(w.x)] + w.z * x[r1 + u32(w.y)];
    out[i] = (1.0 - h.z) * top + h.z * bottom;
}

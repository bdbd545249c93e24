// Direct convolution over [N, C, H, W] (1-D runs with H = KH = 1), groups g:
//   plain:      y[n,co,oy,ox] = b[co] + sum_{ci in group, ky, kx} x[n,ci,iy,ix] w[co,ci',ky,kx]
//               iy = oy*s - p + ky*d
//   transposed: the same sum over the iy with iy*s - p + ky*d = oy (the adjoint of plain),
//               weight [C_in, C_out/g, kh, kw]
// Threads run over (n, group, channel tile, oy, ox) with ox fastest, so neighbours share the
// weights they load and read neighbouring input.

override HAS_BIAS: bool = true;

struct ConvParams {
    n: u32,
    g: u32,
    cin_pg: u32,
    cout_pg: u32,
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
    s_co: u32,        // weight stride between output channels of a group
    s_ci: u32,        // weight stride between input channels of a group
    tiles: u32,       // channel tiles per group (conv_tile4) or channels per group (scalar)
    transposed: u32,
}

@group(0) @binding(0) var<uniform> p: ConvParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// Input coordinate that kernel tap k brings to output coordinate o, or -1 when none does.
fn source(o: u32, k: u32, size: u32, s: u32, pad: u32, d: u32) -> i32 {
    if (p.transposed == 0u) {
        let i = i32(o * s + k * d) - i32(pad);
        return select(-1, i, i >= 0 && i < i32(size));
    }
    let t = i32(o + pad) - i32(k * d);
    if (t < 0 || u32(t) % s != 0u || u32(t) / s >= size) {
        return -1;
    }
    return t / i32(s);
}

struct Site {
    n: u32,
    grp: u32,
    tile: u32,
    oy: u32,
    ox: u32,
}

fn site(i: u32) -> Site {
    let plane = p.oh * p.ow;
    let r = i % plane;
    let q = i / plane;
    return Site(q / (p.tiles * p.g), (q / p.tiles) % p.g, q % p.tiles, r / p.ow, r % p.ow);
}

// First element of input channel 0 of the site's group, and of the weight of output channel
// co (local to the group) at input channel 0.
fn x_base(s: Site) -> u32 {
    return (s.n * p.g + s.grp) * p.cin_pg * p.ih * p.iw;
}

fn w_base(s: Site, co: u32) -> u32 {
    return s.grp * p.cout_pg * p.cin_pg * p.kh * p.kw + co * p.s_co;
}

fn out_index(s: Site, co: u32) -> u32 {
    let c = s.grp * p.cout_pg + co;
    return ((s.n * p.g * p.cout_pg + c) * p.oh + s.oy) * p.ow + s.ox;
}

fn thread_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return wg_linear(wid, nwg) * 64u + lid;
}

@compute @workgroup_size(64)
fn conv_scalar(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = thread_index(wid, nwg, lid);
    if (i >= p.n * p.g * p.tiles * p.oh * p.ow) { return; }
    let s = site(i);
    let plane = p.ih * p.iw;
    let xb = x_base(s);
    let wb = w_base(s, s.tile);
    var acc = 0.0;
    for (var ky = 0u; ky < p.kh; ky = ky + 1u) {
        let iy = source(s.oy, ky, p.ih, p.sh, p.ph, p.dh);
        if (iy < 0) { continue; }
        for (var kx = 0u; kx < p.kw; kx = kx + 1u) {
            let ix = source(s.ox, kx, p.iw, p.sw, p.pw, p.dw);
            if (ix < 0) { continue; }
            let xo = xb + u32(iy) * p.iw + u32(ix);
            let wo = wb + ky * p.kw + kx;
            for (var ci = 0u; ci < p.cin_pg; ci = ci + 1u) {
                acc = acc + x[xo + ci * plane] * w[wo + ci * p.s_ci];
            }
        }
    }
    let c = s.grp * p.cout_pg + s.tile;
    if (HAS_BIAS) {
        acc = acc + bias[c];
    }
    out[out_index(s, s.tile)] = acc;
}

@compute @workgroup_size(64)
fn conv_tile4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = thread_index(wid, nwg, lid);
    if (i >= p.n * p.g * p.tiles * p.oh * p.ow) { return; }
    let s = site(i);
    let plane = p.ih * p.iw;
    let xb = x_base(s);
    let co0 = s.tile * 4u;
    // a ragged last tile re-reads the group's last channel and does not write it
    let co = min(vec4<u32>(co0, co0 + 1u, co0 + 2u, co0 + 3u), vec4<u32>(p.cout_pg - 1u));
    let wb = vec4<u32>(w_base(s, co.x), w_base(s, co.y), w_base(s, co.z), w_base(s, co.w));
    var acc = vec4<f32>(0.0);
    for (var ky = 0u; ky < p.kh; ky = ky + 1u) {
        let iy = source(s.oy, ky, p.ih, p.sh, p.ph, p.dh);
        if (iy < 0) { continue; }
        for (var kx = 0u; kx < p.kw; kx = kx + 1u) {
            let ix = source(s.ox, kx, p.iw, p.sw, p.pw, p.dw);
            if (ix < 0) { continue; }
            let xo = xb + u32(iy) * p.iw + u32(ix);
            let wo = wb + vec4<u32>(ky * p.kw + kx);
            for (var ci = 0u; ci < p.cin_pg; ci = ci + 1u) {
                let wi = wo + vec4<u32>(ci * p.s_ci);
                acc = acc + x[xo + ci * plane] * vec4<f32>(w[wi.x], w[wi.y], w[wi.z], w[wi.w]);
            }
        }
    }
    let c = vec4<u32>(s.grp * p.cout_pg) + co;
    if (HAS_BIAS) {
        acc = acc + vec4<f32>(bias[c.x], bias[c.y], bias[c.z], bias[c.w]);
    }
    for (var t = 0u; t < 4u; t = t + 1u) {
        if (co0 + t < p.cout_pg) {
            out[out_index(s, co0 + t)] = acc[t];
        }
    }
}

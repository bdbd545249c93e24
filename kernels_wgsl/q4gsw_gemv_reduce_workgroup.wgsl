// Entry point of q4gsw_coop_gemv.wgsl without subgroups: the lanes' column sums meet in
// workgroup memory by a pairwise tree, log2(LANES) rounds: in the round of width h, lane l < h
// of column c adds lane l + h. Every round's COLS * h adds are spread over all the lanes.
// Then lane c stores columns 2c and 2c + 1.

var<workgroup> lane_sums: array<f32, COLS * LANES>;   // [column][lane]

@compute @workgroup_size(LANES)
fn q4gsw_coop_gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lane: u32) {
    let n0 = wg_linear(wid, nwg) * COLS;
    if (n0 >= p.n) {
        return;   // uniform per workgroup
    }
    let part = lane_partials(n0, lane);
    for (var c = 0u; c < COLS; c = c + 1u) {
        lane_sums[c * LANES + lane] = acc_col(part, c);
    }
    for (var h = LANES / 2u; h > 0u; h = h / 2u) {
        workgroupBarrier();
        let shift = countTrailingZeros(h);
        for (var i = lane; i < COLS * h; i = i + LANES) {
            let at = (i >> shift) * LANES + (i & (h - 1u));
            lane_sums[at] = lane_sums[at] + lane_sums[at + h];
        }
    }
    workgroupBarrier();
    if (lane < COLS / 2u) {
        store_columns(n0, 2u * lane, lane_sums[2u * lane * LANES],
                      lane_sums[(2u * lane + 1u) * LANES]);
    }
}

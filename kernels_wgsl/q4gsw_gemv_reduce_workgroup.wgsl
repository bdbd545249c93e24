// Entry point of q4gsw_coop_gemv.wgsl without subgroups: the 64 lanes' sums meet in workgroup
// memory in two rounds (lane 8c + j adds lanes j, j+8, .., j+56 of column c, then lane c adds
// those 8), two barriers where a tree over 64 lanes takes six.

var<workgroup> lane_sums: array<f32, 512>;   // [column][lane]
var<workgroup> round_sums: array<f32, 64>;   // [column][j]

@compute @workgroup_size(64)
fn q4gsw_coop_gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lane: u32) {
    let n0 = wg_linear(wid, nwg) * COLS;
    if (n0 >= p.n) {
        return;   // uniform per workgroup
    }
    let part = lane_partials(n0, lane);
    for (var c = 0u; c < COLS; c = c + 1u) {
        lane_sums[c * LANES + lane] = col_of(part, c);
    }
    workgroupBarrier();
    let c = lane / 8u;
    let j = lane % 8u;
    var s = 0.0;
    for (var i = 0u; i < 8u; i = i + 1u) {
        s = s + lane_sums[c * LANES + j + 8u * i];
    }
    round_sums[lane] = s;
    workgroupBarrier();
    if (lane < COLS) {
        var total = 0.0;
        for (var i = 0u; i < 8u; i = i + 1u) {
            total = total + round_sums[lane * 8u + i];
        }
        store_column(n0, lane, total);
    }
}

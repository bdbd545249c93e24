// Entry point of q4gsw_coop_gemv.wgsl with subgroups (the device requested "subgroup"): each
// subgroup adds its lanes' 8 column sums in registers (subgroupAdd), its first lane parks them
// in workgroup memory, and after one barrier lane c adds column c over the subgroups (2 on a
// 32-wide NVIDIA subgroup, 8 on lavapipe's 8-wide ones).

var<workgroup> subgroup_sums: array<Cols8, 64>;   // one per subgroup: at most 64

@compute @workgroup_size(64)
fn q4gsw_coop_gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lane: u32,
                   @builtin(subgroup_invocation_id) sg_lane: u32,
                   @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) n_sg: u32) {
    let n0 = wg_linear(wid, nwg) * COLS;
    if (n0 >= p.n) {
        return;   // uniform per workgroup: every lane reaches the subgroupAdds
    }
    let part = lane_partials(n0, lane);
    let sums = Cols8(subgroupAdd(part.lo), subgroupAdd(part.hi));
    if (sg_lane == 0u) {
        subgroup_sums[sg] = sums;
    }
    workgroupBarrier();
    if (lane < COLS) {
        var total = 0.0;
        for (var i = 0u; i < n_sg; i = i + 1u) {
            total = total + col_of(subgroup_sums[i], lane);
        }
        store_column(n0, lane, total);
    }
}

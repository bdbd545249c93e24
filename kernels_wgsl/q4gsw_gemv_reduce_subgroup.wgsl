// Entry point of q4gsw_coop_gemv.wgsl with subgroups (the device requested "subgroup"): each
// subgroup adds its lanes' COLS column sums in registers (subgroupAdd), its first lane parks
// them in workgroup memory, and after one barrier lane c adds columns 2c and 2c + 1 over the
// subgroups in order (LANES / 32 of them on NVIDIA's 32-wide subgroups) and stores the pair.
// The workgroup is one column group, so a subgroup never mixes columns, whatever its width.

var<workgroup> subgroup_sums: array<Acc, LANES / 4u>;   // WebGPU subgroups have >= 4 lanes

@compute @workgroup_size(LANES)
fn q4gsw_coop_gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lane: u32,
                   @builtin(subgroup_invocation_id) sg_lane: u32,
                   @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) n_sg: u32) {
    let n0 = wg_linear(wid, nwg) * COLS;
    if (n0 >= p.n) {
        return;   // uniform per workgroup: every lane reaches the subgroupAdds
    }
    let part = lane_partials(n0, lane);
    var sums = Acc(subgroupAdd(part.q0), vec4<f32>(), vec4<f32>(), vec4<f32>());
    if (QUADS > 1u) {
        sums.q1 = subgroupAdd(part.q1);
    }
    if (QUADS > 2u) {
        sums.q2 = subgroupAdd(part.q2);
        sums.q3 = subgroupAdd(part.q3);
    }
    if (sg_lane == 0u) {
        subgroup_sums[sg] = sums;
    }
    workgroupBarrier();
    if (lane < COLS / 2u) {
        var a = 0.0;
        var b = 0.0;
        for (var i = 0u; i < n_sg; i = i + 1u) {
            a = a + acc_col(subgroup_sums[i], 2u * lane);
            b = b + acc_col(subgroup_sums[i], 2u * lane + 1u);
        }
        store_columns(n0, 2u * lane, a, b);
    }
}

"""linear_q4gsw: torchao int4 per-group weights -> packed q4gsw -> CPU kernel, end to end.

The golden is independent of the code under test: dequantize qdata * scale in float64 and
matmul (fp64 dequantize-then-matmul). The WGSL kernels are tested in test_q4gsw_wgsl.py.
"""
import itertools

import pytest
import torch

import kernels_cpu
from delegate.aot import lower
from delegate.ops.q4gsw import pack_q4gsw
from delegate.runtime import Runtime
from kernels_cpu.q4gsw import TILE_BYTES
from kernels_cpu.threadpool import ScratchArena, get_pool
from tests.tolerances import tol

torchao = pytest.importorskip("torchao")
from torchao.quantization import IntxWeightOnlyConfig, quantize_  # noqa: E402
from torchao.quantization.granularity import PerGroup  # noqa: E402
from torchao.quantization.quant_primitives import MappingType  # noqa: E402

MS, NS, KS, GSS = (1, 2, 7, 64, 65), (8, 72, 200), (64, 136, 512), (32, 64, 128)
# K = 136 = 8 * 17 is divisible by no group size in GSS: it appears in the undelegated tests.
GRID = [(m, n, k, gs, bias) for m, n, k, gs, bias
        in itertools.product(MS, NS, KS, GSS, (False, True)) if k % gs == 0]


def random_q4(n: int, k: int, gs: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    qdata = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, k // gs, generator=g) * 0.05 + 0.005
    return qdata, scale


def golden(x, qdata, scale, gs, bias=None) -> torch.Tensor:
    """fp64 dequantize-then-matmul."""
    w = qdata.double() * scale.double().repeat_interleave(gs, dim=1)
    y = x.double() @ w.t()
    return y if bias is None else y + bias.double()


def run_cpu_kernel(x, qdata, scale, gs, bias=None, residual=None) -> torch.Tensor:
    n, k = qdata.shape
    packed, scales = pack_q4gsw(qdata, scale, gs)
    attrs = {"group_size": gs, "K": k, "N": n}
    kernel = kernels_cpu.get_kernel("linear_q4gsw")
    ins = [x, packed, scales, bias] + ([] if residual is None else [residual])
    shapes = [None if t is None else tuple(t.shape) for t in ins]
    scratch = ScratchArena(kernel.scratch_nbytes(shapes, attrs, get_pool().num_threads))
    out = torch.empty(*x.shape[:-1], n)
    kernel.fn(ins, [out], attrs, scratch.reserve(scratch.nbytes))
    return out


# ---- packing ---------------------------------------------------------------------------------
def test_packing_puts_even_k_in_the_low_nibble_stored_plus_8():
    qdata, scale = random_q4(5, 64, 32)
    packed, _ = pack_q4gsw(qdata, scale, 32)
    as_bytes = packed.view(torch.uint8)
    assert as_bytes.shape == (5, 32)
    for n, j in itertools.product(range(5), range(32)):
        lo, hi = int(qdata[n, 2 * j]) + 8, int(qdata[n, 2 * j + 1]) + 8
        assert int(as_bytes[n, j]) == lo | (hi << 4)


def test_packing_u32_words_decode_as_the_design_says():
    qdata, scale = random_q4(3, 128, 64, seed=1)
    words = pack_q4gsw(qdata, scale, 64)[0].to(torch.int64) & 0xFFFFFFFF
    k = torch.arange(128)
    q = ((words[:, k // 8] >> (4 * (k % 8))) & 0xF) - 8
    assert torch.equal(q.to(torch.int8), qdata)


def test_scales_are_groups_by_n_padded_to_4_with_zeros():
    qdata, scale = random_q4(5, 128, 32)
    _, scales = pack_q4gsw(qdata, scale, 32)
    assert scales.shape == (4, 8) and scales.dtype == torch.float32
    assert torch.equal(scales[:, :5], scale.t()) and not scales[:, 5:].any()


# ---- CPU kernel vs the fp64 golden ---------------------------------------------------------
@pytest.mark.parametrize("m,n,k,gs,bias", GRID)
def test_cpu_kernel_matches_fp64_dequant_matmul(m, n, k, gs, bias):
    seed = m + n + k + gs
    qdata, scale = random_q4(n, k, gs, seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    out = run_cpu_kernel(x, qdata, scale, gs, b)
    torch.testing.assert_close(out.double(), golden(x, qdata, scale, gs, b),
                               **tol("q4gsw", "cpu"))


def test_cpu_kernel_takes_batched_activations():
    qdata, scale = random_q4(24, 128, 64)
    x = torch.randn(2, 3, 128)
    out = run_cpu_kernel(x, qdata, scale, 64)
    assert out.shape == (2, 3, 24)
    torch.testing.assert_close(out.double(), golden(x, qdata, scale, 64), **tol("q4gsw", "cpu"))


@pytest.mark.parametrize("m,n,k,bias", [(1, 67, 160, True), (37, 67, 160, False),
                                        (3, 1100, 2048, True)])   # the last: 3 column tiles
def test_cpu_kernel_residual_is_the_unfused_add_bit_for_bit(m, n, k, bias):
    """A fifth input r (delegate/passes/residual_add.py): out = (x @ W^T + b) + r, the bits
    of the kernel without r followed by torch.add, tile by tile."""
    qdata, scale = random_q4(n, k, 32, seed=m)
    g = torch.Generator().manual_seed(n)
    x, r = torch.randn(m, k, generator=g), torch.randn(m, n, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    want = torch.add(run_cpu_kernel(x, qdata, scale, 32, b), r)
    assert torch.equal(run_cpu_kernel(x, qdata, scale, 32, b, residual=r), want)


def test_cpu_kernel_scratch_is_a_tile_per_worker_not_the_weight():
    k, n, workers = 2048, 128256, 2   # Llama-3.2-1B's LM head: 1 GiB as float32
    need = kernels_cpu.get_kernel("linear_q4gsw").scratch_nbytes(
        [(1, k), (n, k // 8), (k // 64, n), None], {"group_size": 64, "K": k, "N": n}, workers)
    assert need <= workers * (TILE_BYTES * 1.125 + 128) < n * k * 4 / 16


# ---- from torchao, end to end ----------------------------------------------------------------
class TwoLayers(torch.nn.Module):
    def __init__(self, k, hidden, n, bias=True):
        super().__init__()
        self.up = torch.nn.Linear(k, hidden, bias=bias)
        self.down = torch.nn.Linear(hidden, n, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def quantized(model, gs, mapping=MappingType.SYMMETRIC):
    torch.manual_seed(0)
    model = model.eval()
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(gs),
                                          mapping_type=mapping))
    return model


def lowered_ops(pm) -> list:
    from delegate import blob

    ops = []
    for d in pm.executorch_program.execution_plan[0].delegates:
        raw = d.processed
        data = pm.executorch_program.backend_delegate_data[raw.index].data
        ops += [node.op for node in blob.decode(bytes(data)).nodes]
    return ops


def test_torchao_model_lowers_to_q4gsw_and_matches_eager_on_cpu():
    model = quantized(TwoLayers(k=128, hidden=64, n=40), 32)
    x = torch.randn(5, 128)
    want = model(x)
    pm = lower(model, (x,), device="cpu")
    assert lowered_ops(pm).count("linear_q4gsw") == 2
    method = Runtime.get().load_program(pm.buffer, device="cpu").load_method("forward")
    got = method.execute([x])[0]
    torch.testing.assert_close(got, want, **tol("q4gsw", "cpu"))


def test_torchao_model_with_dynamic_rows_routes_every_m(tmp_path):
    model = quantized(TwoLayers(k=64, hidden=64, n=24), 64)
    batch = torch.export.Dim("m", min=1, max=65)
    pm = lower(model, (torch.randn(7, 64),), dynamic_shapes=({0: batch},), device="cpu")
    method = Runtime.get().load_program(pm.buffer, device="cpu").load_method("forward")
    for m in (1, 2, 65):
        x = torch.randn(m, 64)
        torch.testing.assert_close(method.execute([x])[0], model(x), **tol("q4gsw", "cpu"))


def test_weights_stay_packed_in_the_program():
    """Resident weights are what the delegate's constants hold: 0.5 B/param + 4/gs scales."""
    from delegate import blob
    from delegate.ir import TensorValue

    k, n, gs = 512, 200, 128
    model = quantized(torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)), gs)
    pm = lower(model, (torch.randn(2, k),), device="cpu")
    d = pm.executorch_program.execution_plan[0].delegates[0]
    graph = blob.decode(bytes(pm.executorch_program.backend_delegate_data[d.processed.index].data))
    consts = [v for v in graph.values if isinstance(v, TensorValue) and v.constant_key]
    nbytes = sum(torch.empty(v.max_shape, dtype=v.dtype).nbytes for v in consts)
    assert nbytes <= 0.6 * n * k
    assert all(v.dtype != torch.int8 for v in consts)   # the unpacked qdata never ships


# ---- left undelegated, with a reason ------------------------------------------------------------
def rejections(model, x) -> str:
    from delegate.partitioner import WgpuPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    part = WgpuPartitioner(device="cpu")
    ep = torch.export.export(model, (x,))
    to_edge_transform_and_lower(ep, partitioner=[part],
                                compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return " | ".join(part.last_rejections)


def test_nonzero_zero_points_stay_undelegated_with_a_reason():
    model = quantized(torch.nn.Sequential(torch.nn.Linear(64, 16)), 32, MappingType.ASYMMETRIC)
    why = rejections(model, torch.randn(2, 64))
    assert "zero points" in why


def test_group_size_outside_32_to_256_stays_undelegated_with_a_reason():
    model = quantized(torch.nn.Sequential(torch.nn.Linear(136, 16)), 8)
    assert "block size" in rejections(model, torch.randn(2, 136))


def test_k_not_a_multiple_of_8_stays_undelegated_with_a_reason():
    model = quantized(torch.nn.Sequential(torch.nn.Linear(36, 16)), 4)
    assert "K: expected a multiple of 8" in rejections(model, torch.randn(2, 36))


class RawDequantLinear(torch.nn.Module):
    """dequantize_affine + linear written by hand, to reach cases torchao's quantize_ avoids."""

    def __init__(self, n, k, gs, groups):
        super().__init__()
        self.register_buffer("qdata", torch.randint(-8, 8, (n, k), dtype=torch.int8))
        self.register_buffer("scale", torch.rand(n, groups) * 0.1)
        self.register_buffer("zero", torch.zeros(n, groups, dtype=torch.int8))
        self.gs = gs

    def forward(self, x):
        w = torch.ops.torchao.dequantize_affine(self.qdata, [1, self.gs], self.scale, self.zero,
                                                torch.int8, -8, 7)
        return torch.nn.functional.linear(x, w)


def test_group_size_not_dividing_k_is_refused_with_a_reason():
    """torchao cannot even export a ragged last group, so check the support rule directly."""
    from delegate.ops import export
    from delegate.ops.q4gsw import why_not_q4gsw

    g = torch.fx.Graph()
    q, s, z = g.placeholder("q"), g.placeholder("s"), g.placeholder("z")
    dq = g.call_function(torch.ops.torchao.dequantize_affine.default,
                         (q, [1, 32], s, z, torch.int8, -8, 7))
    n, k = 16, 136   # 136 = 4 * 32 + 8
    constants = {"q": torch.zeros(n, k, dtype=torch.int8), "s": torch.ones(n, 5),
                 "z": torch.zeros(n, 5, dtype=torch.int8)}
    with export.program_constants(constants):
        assert why_not_q4gsw(dq) == "K: expected a multiple of the group size 32, got 136"


def test_dequantize_with_a_non_linear_user_stays_undelegated():
    class Tied(RawDequantLinear):
        def forward(self, x):
            w = torch.ops.torchao.dequantize_affine(self.qdata, [1, 32], self.scale, self.zero,
                                                    torch.int8, -8, 7)
            return torch.nn.functional.linear(x, w) + w.sum()

    why = rejections(Tied(16, 64, 32, 2), torch.randn(2, 64))
    assert "expected aten.linear or aten.embedding reading it as weight" in why


def test_undelegated_dequantize_stays_outside_every_delegate():
    """The linear may still be claimed as a plain float32 linear; its dequantize is not.
    (ExecuTorch's to_executorch then wants an out variant of torchao::dequantize_affine, which
    torchao does not register: such a program lowers to edge but not to a .pte.)"""
    from delegate.partitioner import WgpuPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    model = quantized(torch.nn.Sequential(torch.nn.Linear(64, 16)), 32, MappingType.ASYMMETRIC)
    edge = to_edge_transform_and_lower(
        torch.export.export(model, (torch.randn(3, 64),)), partitioner=[WgpuPartitioner("cpu")],
        compile_config=EdgeCompileConfig(_check_ir_validity=False))
    graph = edge.exported_program().graph
    outside = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    assert any("dequantize_affine" in t for t in outside)

"""Creation ops (arange, full, cumsum, triu, tril; delegate/ops/creation.py): one node through
each executor against torch in float64, then a program that builds its positions and masks
from a dynamic length, through the partitioner, on both executors.

Integer and bool results are exact. Float aranges take the "elementwise" tolerance (WebGPU
computes start + i * step in f32, torch in double), float cumsums the "cumsum" one (WebGPU
adds each line in order in f32). Lengths are prime (and 0); WebGPU runs for real (lavapipe
in CI) and holds int64 as i32, so values stay within 32 bits.
"""
import pytest
import torch
from executorch.exir import to_edge
from torch import nn

from delegate.aot import lower, undelegated_ops
from delegate.errors import DelegateError
from delegate.ops import get_op
from delegate.ops._common import claiming_for
from delegate.ops.creation import dtype_name, fill_value
from delegate.ops.export import op_for_target
from tests.test_comparison_ops import check_exact
from tests.test_kernels_cpu import threads  # noqa: F401  (the pool-size fixture)
from tests.test_models import run_pte
from tests.test_nan_wgsl import run_op, with_specials
from tests.test_op_registry import _random_shapes
from tests.test_pass_fuse_linear import _ops as delegated_ops
from tests.test_resident_state import Cache
from tests.tolerances import tol

EXECUTORS = ["cpu", "webgpu"]
NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def check_float(got, want64, family: str, executor: str) -> None:
    assert got.dtype == torch.float32 and tuple(got.shape) == tuple(want64.shape)
    torch.testing.assert_close(got.double(), want64, equal_nan=True, **tol(family, executor))


# ---- arange -----------------------------------------------------------------------------------
ARANGES = {   # case -> (start, end, step, dtype)
    "int64-29": (0, 29, 1, torch.int64),
    "int64-step3-from_negative": (-7, 31, 3, torch.int64),       # 13 elements
    "int32-descending": (5, -23, -2, torch.int32),                # 14 elements
    "float32-tenths": (0.5, 3.2, 0.1, torch.float32),             # ceil(27.000000000000004)
    "float32-int_bounds": (0, 11, 1, torch.float32),
    "float32-descending": (2.0, -1.7, -0.25, torch.float32),
    "int64-empty": (3, 3, 1, torch.int64),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(ARANGES))
def test_arange_matches_torch_length_and_values(case, executor):
    start, end, step, dtype = ARANGES[case]
    attrs = {"start": start, "end": end, "step": step, "dtype": dtype_name(dtype)}
    got = run_op(executor, "arange", [], attrs, out_dtype=dtype)[0]
    if dtype == torch.float32:
        check_float(got, torch.arange(start, end, step, dtype=torch.float64), "elementwise",
                    executor)
    else:
        check_exact(got, torch.arange(start, end, step, dtype=dtype))


@pytest.mark.parametrize("bounds", [(0, 5, 0), (5, 0, 1), (0.0, 1.0, -0.5)],
                         ids=["step0", "end_behind", "float_end_behind"])
def test_arange_infer_refuses_a_zero_step_or_an_end_the_step_moves_away_from(bounds):
    start, end, step = bounds
    with pytest.raises(DelegateError, match="expected"):
        get_op("arange").infer([], {"start": start, "end": end, "step": step, "dtype": "int64"})


def test_creation_infer_refuses_a_dtype_it_does_not_make():
    with pytest.raises(DelegateError, match="dtype attribute"):
        get_op("arange").infer([], {"start": 0, "end": 3, "step": 1, "dtype": "bool"})
    with pytest.raises(DelegateError, match="dtype attribute"):
        get_op("full").infer([], {"sizes": [2], "value": 1, "dtype": "float64"})


# ---- full -------------------------------------------------------------------------------------
FULLS = {   # case -> (sizes, value as lowered, dtype)
    "bool-true": ([3, 7], 1, torch.bool),
    "int64-negative": ([11], -7, torch.int64),
    "int32-max": ([2, 5], 2 ** 31 - 1, torch.int32),
    "float32-neg_inf": ([5, 1, 3], -INF, torch.float32),
    "float32-min": ([13], torch.finfo(torch.float32).min, torch.float32),
    "float32-0d": ([], 0.1, torch.float32),
    "int64-empty": ([0, 3], 4, torch.int64),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(FULLS))
def test_full_fills_every_element_in_its_dtype(case, executor):
    sizes, value, dtype = FULLS[case]
    attrs = {"sizes": sizes, "value": value, "dtype": dtype_name(dtype)}
    got = run_op(executor, "full", [], attrs, out_dtype=dtype)[0]
    check_exact(got, torch.full(sizes, value, dtype=dtype))


@pytest.mark.parametrize("value", [2.7, -2.7, 0.0, -0.5, 3, True, False])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.float32])
def test_fill_value_is_converted_to_the_dtype_as_torch_converts_it(value, dtype):
    got = torch.tensor(fill_value(value, dtype)).to(dtype)
    assert torch.equal(got, torch.full((), value, dtype=dtype)), (value, dtype)


class Wide(nn.Module):
    def forward(self, x):
        return torch.full((3,), 2 ** 40) + x, torch.arange(0, 2 ** 33, 2 ** 31)


def test_check_refuses_integers_past_32_bits_on_webgpu_only():
    """WebGPU holds int64 as i32, so a fill value or bound past it cannot reach the kernel."""
    graph = to_edge(torch.export.export(Wide(), (torch.arange(3),))).exported_program().graph
    ops = {n: op_for_target(n.target) for n in graph.nodes if n.op == "call_function"}
    nodes = {n: op.check for n, op in ops.items() if op and op.name in ("full", "arange")}
    assert len(nodes) == 2
    for node, check in nodes.items():
        assert check(node) is None
        with claiming_for("webgpu"):
            assert "expected a 32-bit integer" in check(node)


# ---- cumsum -----------------------------------------------------------------------------------
CUMSUMS = {   # case -> (x, dim, result dtype)
    "float-last_dim": (lambda: torch.randn(3, 97, dtype=torch.float64), -1, torch.float32),
    "float-dim0": (lambda: torch.randn(29, 5, 3, dtype=torch.float64), 0, torch.float32),
    "float-middle_dim": (lambda: torch.randn(3, 11, 7, dtype=torch.float64), 1, torch.float32),
    "float-nan_inf": (lambda: with_specials(5, 13), 1, torch.float32),
    "int64": (lambda: torch.randint(-1000, 1000, (7, 11)), 1, torch.int64),
    "int32-to_int64": (lambda: torch.randint(-9, 9, (13, 3), dtype=torch.int32), 0, torch.int64),
    "bool-padding_mask": (lambda: torch.rand(2, 31) > 0.3, 1, torch.int64),
    "int64-to_float": (lambda: torch.randint(-5, 5, (3, 17)), 1, torch.float32),
    "float-0d": (lambda: torch.tensor(2.5, dtype=torch.float64), 0, torch.float32),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(CUMSUMS))
def test_cumsum_is_the_running_sum_along_dim(case, executor):
    make, dim, dtype = CUMSUMS[case]
    x = make()
    attrs = {"dim": dim, "dtype": dtype_name(dtype)}
    got = run_op(executor, "cumsum", [x], attrs, out_dtype=dtype)[0]
    if dtype == torch.float32:
        want = torch.cumsum(x.float().double() if x.is_floating_point() else x, dim,
                            dtype=torch.float64)
        check_float(got, want, "cumsum", executor)
    else:
        check_exact(got, torch.cumsum(x, dim, dtype=dtype))


def test_cumsum_infer_refuses_a_dim_out_of_range():
    with pytest.raises(DelegateError, match="cumsum dim"):
        get_op("cumsum").infer([(3, 5)], {"dim": 2, "dtype": "int64"})


# ---- triu / tril ------------------------------------------------------------------------------
TRIANGLES = {   # case -> (x, diagonal)
    "float-batched": (lambda: torch.randn(3, 7, 11), 0),
    "float-below": (lambda: torch.randn(11, 7), -2),
    "float-above": (lambda: torch.randn(2, 5, 13), 3),
    "bool-causal": (lambda: torch.ones(13, 13, dtype=torch.bool), 0),
    "int64-wide_diagonal": (lambda: torch.randint(-9, 9, (5, 7)), 10 ** 12),
    "int32-far_below": (lambda: torch.randint(-9, 9, (5, 7), dtype=torch.int32), -(10 ** 12)),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(TRIANGLES))
@pytest.mark.parametrize("op", ["triu", "tril"])
def test_triangle_keeps_one_side_of_the_diagonal_and_zeroes_the_other(op, case, executor):
    make, diagonal = TRIANGLES[case]
    x = make()
    got = run_op(executor, op, [x], {"diagonal": diagonal}, out_dtype=x.dtype)[0]
    check_exact(got, getattr(torch, op)(x, diagonal))


def test_triangle_infer_refuses_a_vector():
    with pytest.raises(DelegateError, match="rank >= 2"):
        get_op("triu").infer([(5,)], {"diagonal": 0})


@pytest.mark.parametrize("op, attrs", [("cumsum", {"dim": -1, "dtype": "int64"}),
                                       ("triu", {"diagonal": 1}), ("tril", {"diagonal": -2})])
def test_infer_raises_only_delegate_errors_on_arbitrary_shapes(op, attrs):
    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        shapes = _random_shapes(gen, 1)
        try:
            out = get_op(op).infer(shapes, dict(attrs))
        except DelegateError as e:
            assert "expected" in str(e), str(e)
            continue
        assert out == [shapes[0]]


def test_cumsum_and_triangles_large_split_across_cpu_threads(threads):  # noqa: F811
    x = torch.randn(4, 257, 263)
    check_float(run_op("cpu", "cumsum", [x], {"dim": 1, "dtype": "float32"})[0],
                torch.cumsum(x.double(), 1), "cumsum", "cpu")
    for op in ("triu", "tril"):
        check_exact(run_op("cpu", op, [x], {"diagonal": -3})[0], getattr(torch, op)(x, -3))


# ---- a program that builds positions and masks from its length --------------------------------
class PositionsAndMasks(nn.Module):
    """What a decoder builds in forward from its length T (x: [1, T, 8])."""

    def forward(self, x):
        T = x.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool).tril()           # full, tril
        bias = torch.full((T, T), -INF).triu(1)                      # full, triu
        halves = torch.arange(T, dtype=torch.float32) * 0.5          # float arange
        evens = torch.arange(0, 2 * T, 2)                            # symbolic end, step 2
        backwards = x.index_select(1, torch.arange(T - 1, -1, -1))   # symbolic start, index
        same = x[:, torch.arange(T)]                 # a host-known range a kernel reads
        count = (x > 0).cumsum(1)                                    # bool -> int64
        capped = torch.where(count > 2, count, torch.scalar_tensor(-1, dtype=torch.int64))
        return causal, bias, halves, evens, backwards, same, capped, x.cumsum(-1), \
            torch.full_like(x, 2.5)


@pytest.fixture(scope="module")
def positions_program():
    """device -> the lowered program (one export and lowering per device for the module)."""
    seq = torch.export.Dim("seq", min=2, max=32)
    return {device: lower(PositionsAndMasks(), (torch.randn(1, 9, 8),),
                          dynamic_shapes=({1: seq},), device=device) for device in EXECUTORS}


@pytest.mark.parametrize("device", EXECUTORS)
def test_positions_and_masks_are_delegated_and_match_eager_at_each_length(device,
                                                                         positions_program):
    pm = positions_program[device]
    assert undelegated_ops(pm) == []
    xs = [torch.randn(1, t, 8) for t in (2, 13, 32)]
    for x, got in zip(xs, run_pte(pm, [(x,) for x in xs], device)):
        want = PositionsAndMasks()(x)
        for g, w in zip(got[:7] + got[8:], want[:7] + want[8:]):
            check_exact(g, w)
        check_float(got[7], torch.cumsum(x.double(), -1), "cumsum", device)


def test_host_ranges_become_aranges_only_where_a_kernel_reads_them(positions_program):
    """Four aranges reach a kernel, arange(T) a host-known range emitted where index reads
    it; the host-known 0-d -1 that the where reads becomes a 0-d full."""
    ops = delegated_ops(positions_program["cpu"])
    assert ops.count("arange") == 4
    assert ops.count("full") == 4   # ones, full, scalar_tensor, full_like
    assert {"tril", "triu", "cumsum", "index"} <= set(ops)


# ---- host-known ranges: folded where their users take them, an arange where a kernel reads ----
class CacheAndPositions(Cache):
    """Cache's write at rows pos + arange(T), which also returns those rows as floats."""

    def forward(self, x, input_pos):
        pos = input_pos[-1].item()
        torch._check(pos >= 0)
        torch._check(pos + x.shape[1] <= self.cache.shape[1])
        rows = torch.arange(x.shape[1]) + pos
        self.cache[:, rows] = x
        return self.cache * 2, rows.float()


def _cache_lowered(model, device):
    t = torch.export.Dim("T", min=1, max=7)
    return lower(model, (torch.randn(1, 3, 5), torch.tensor([0])), dynamic_shapes=({1: t}, None),
                 device=device)


def test_a_range_only_a_cache_write_takes_lowers_to_no_arange():
    assert "arange" not in delegated_ops(_cache_lowered(Cache(), "cpu"))


@pytest.mark.parametrize("device", EXECUTORS)
def test_a_range_a_kernel_also_reads_is_one_arange_that_follows_the_position(device):
    """The arange starts at the position symbol: an offset that keys no plan, so its start is
    re-read at every execute (WebGPU: its params rewritten) while one plan replays."""
    pm = _cache_lowered(CacheAndPositions(), device)
    assert undelegated_ops(pm) == [] and delegated_ops(pm).count("arange") == 1
    eager = CacheAndPositions()
    steps = [(0, 3), (3, 1), (4, 1), (5, 2)]
    inputs = [(torch.randn(1, t, 5), torch.tensor([pos])) for pos, t in steps]
    for (x, at), (cache, rows) in zip(inputs, run_pte(pm, inputs, device)):
        want_cache, want_rows = eager(x, at)
        check_exact(rows, want_rows)
        torch.testing.assert_close(cache, want_cache, **tol("shape", device))

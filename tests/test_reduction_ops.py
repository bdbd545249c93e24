"""Reductions (sum, mean, amax, amin, var) on both executors against float64 eager PyTorch:
dim lists, negative dims, [] meaning all, keepdim both ways, var's correction, NaN and Inf,
and a model using them end to end as one delegate call; argmax, argmin and median (int64
indices) against torch, ties and NaN included; sum / mean of an integer input with dtype=float32."""
import dataclasses

import pytest
import torch
from torch import nn

from delegate.aot import lower, undelegated_ops
from delegate.errors import DelegateError
from delegate.models import seeded
from delegate.ops import get_op
from tests.test_kernels_cpu import run1, threads  # noqa: F401  (threads is a fixture)
from tests.test_kernels_wgsl import run_wgsl, single_op_graph
from tests.test_models import run_pte
from tests.test_unary_ops import delegate_calls
from tests.tolerances import tol

# torch warns on var with dof <= 0, which the dof cases do on purpose
pytestmark = pytest.mark.filterwarnings(r"ignore:var\(\). degrees of freedom")


def reference(op: str, x, dims, keepdim, correction=1.0):
    """torch in float64; dims [] means all, as torch reads it."""
    dims = list(dims) if dims else list(range(x.dim()))
    if op == "var":
        return torch.var(x, dims, correction=correction, keepdim=keepdim)
    return getattr(torch, op)(x, dims, keepdim=keepdim)


def run_on(executor: str, op: str, x, attrs):
    if executor == "cpu":
        return run1(op, [x.float()], **attrs)
    return run_wgsl(op, [x], attrs)[0]


def check_family(got, want, executor: str, family: str) -> None:
    """Shape equal, values within the family's tolerance, NaN where the reference has NaN."""
    assert tuple(got.shape) == tuple(want.shape)
    torch.testing.assert_close(got.double(), want, equal_nan=True, **tol(family, executor))


def check(got, want, executor):
    check_family(got, want, executor, "reduction")


OPS = ["sum", "mean", "amax", "amin", "var"]
CASES = [   # (shape, dims, keepdim)
    ((3, 5, 7), [1], False), ((3, 5, 7), [-1], True), ((3, 5, 7), [0, 2], False),
    ((3, 5, 7), [2, -3], True), ((3, 5, 7), [], False), ((3, 5, 7), [], True),
    ((2, 3, 11, 13), [1, 3], False), ((2, 3, 11, 13), [-2, -1], True), ((13,), [0], False),
    ((7, 1, 5), [1], False), ((5, 129), [1], False),   # 129 > one workgroup's 128 lanes
]


def _attrs(op, dims, keepdim, correction=1.0):
    return {"dims": list(dims), "keepdim": keepdim,
            **({"correction": correction} if op == "var" else {})}


@pytest.mark.parametrize("executor", ["cpu", "webgpu"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, dims, keepdim", CASES)
def test_reduction_matches_float64(executor, op, shape, dims, keepdim):
    x = torch.randn(*shape, dtype=torch.float64).float().double()
    got = run_on(executor, op, x, _attrs(op, dims, keepdim))
    check(got, reference(op, x, dims, keepdim), executor)


@pytest.mark.parametrize("executor", ["cpu", "webgpu"])
@pytest.mark.parametrize("correction", [0.0, 1.0, 2.5])
def test_var_correction(executor, correction):
    x = (torch.randn(5, 11, dtype=torch.float64) * 3 + 100).float().double()   # large mean
    got = run_on(executor, "var", x, _attrs("var", [1], False, correction))
    check(got, reference("var", x, [1], False, correction), executor)


@pytest.mark.parametrize("executor", ["cpu", "webgpu"])
def test_var_without_degrees_of_freedom_is_inf_or_nan(executor):
    """torch: dof = max(0, N - correction) = 0 gives ss / 0: inf, or NaN when ss is 0."""
    x = torch.tensor([[1.0, 2.0], [3.0, 3.0]], dtype=torch.float64)
    got = run_on(executor, "var", x, _attrs("var", [1], False, 2.0))
    assert torch.isposinf(got[0]) and torch.isnan(got[1])


@pytest.mark.parametrize("executor", ["cpu", "webgpu"])
@pytest.mark.parametrize("op", OPS)
def test_rank0_input(executor, op):
    x = torch.tensor(2.5, dtype=torch.float64)
    check(run_on(executor, op, x, _attrs(op, [], False)), reference(op, x, [], False), executor)


@pytest.mark.parametrize("executor", ["cpu", "webgpu"])
@pytest.mark.parametrize("op", ["amax", "amin"])
def test_amax_amin_propagate_nan_and_keep_inf(executor, op):
    x = torch.randn(4, 131, dtype=torch.float64)
    x[0, 7] = float("nan")
    x[1, 130] = float("nan")     # in a lane past the first 128
    x[2, 3] = float("inf")
    x[3, 5] = float("-inf")
    want = reference(op, x, [1], False)
    got = run_on(executor, op, x, _attrs(op, [1], False))
    check(got, want, executor)
    assert torch.isnan(got[:2]).all()


@pytest.mark.parametrize("executor", ["cpu", "webgpu"])
@pytest.mark.parametrize("op", ["sum", "mean", "var"])
def test_nan_propagates_through_sum_mean_var(executor, op):
    x = torch.randn(3, 7, dtype=torch.float64)
    x[1, 4] = float("nan")
    got = run_on(executor, op, x, _attrs(op, [1], False))
    check(got, reference(op, x, [1], False), executor)


def test_cpu_split_path_matches(threads):  # noqa: F811
    """Large enough for the pool to split dim 0 across workers."""
    x = torch.randn(97, 2053)
    for op in OPS:
        check(run1(op, [x], **_attrs(op, [-1], True)), reference(op, x.double(), [-1], True),
              "cpu")


@pytest.mark.parametrize("dims, want", [([3], "a dim in"), ([1, -2], "distinct dims")])
def test_bad_dims_are_typed_errors(dims, want):
    with pytest.raises(DelegateError, match=want):
        get_op("sum").infer([(3, 5, 7)], {"dims": dims, "keepdim": False})


def test_amax_over_empty_dim_is_a_typed_error():
    with pytest.raises(DelegateError, match="non-empty reduction"):
        get_op("amax").infer([(3, 0, 7)], {"dims": [1], "keepdim": False})


def run_indexed(executor: str, op: str, x, dims, keepdim):
    """argmax / argmin (the index) or median ([value] or [value, index]) on one executor."""
    from delegate.runtime.cpu_executor import CpuExecutor
    from delegate.runtime.webgpu_executor import WebGpuExecutor

    attrs = {"dims": list(dims), "keepdim": keepdim, **({"indices": bool(dims)}
                                                        if op == "median" else {})}
    graph, weights, feed = single_op_graph(op, [x.float()], attrs)
    for j, vid in enumerate(graph.outputs):   # the index output is int64
        if op != "median" or j == 1:
            graph.values[vid] = dataclasses.replace(graph.values[vid], dtype=torch.int64)
    ex = (WebGpuExecutor if executor == "webgpu" else CpuExecutor)(graph, weights)
    try:
        return ex.execute(feed)
    finally:
        ex.destroy()


def indexed_reference(op: str, x, dims, keepdim) -> list:
    if op == "median":
        return list(torch.median(x, dims[0], keepdim)) if dims else [torch.median(x)]
    return [getattr(torch, op)(x, dims[0] if dims else None, keepdim=keepdim)]


INDEXED_CASES = [   # (shape, dims, keepdim): one dim, or [] (the flattened input)
    ((3, 5, 7), [1], False), ((3, 5, 8), [-1], True), ((3, 5, 7), [0], False),
    ((2, 3, 4, 5), [], False), ((3, 5, 7), [], True), ((4, 129), [1], False), ((13,), [0], True),
    ((), [], False),
]


@pytest.mark.parametrize("executor", ["cpu", "webgpu"])
@pytest.mark.parametrize("op, shape, dims, keepdim", [
    (op, *case) for op in ("argmax", "argmin", "median") for case in INDEXED_CASES
    if not (op == "median" and case[2] and not case[1])])   # median.default has no keepdim
def test_indexed_reduction_matches_torch(executor, op, shape, dims, keepdim):
    x = torch.randn(shape, dtype=torch.float64).float().double()   # no ties
    got, want = run_indexed(executor, op, x, dims, keepdim), indexed_reference(op, x, dims, keepdim)
    assert [(g.dtype, g.shape) for g in got] == [(w.dtype if w.dtype == torch.int64
                                                  else torch.float32, w.shape) for w in want]
    for g, w in zip(got, want):
        assert torch.equal(g.double() if w.is_floating_point() else g, w)


@pytest.mark.parametrize("executor", ["cpu", "webgpu"])
@pytest.mark.parametrize("op", ["argmax", "argmin", "median"])
def test_indexed_reduction_ties_and_nan_follow_torch(executor, op):
    """Equal extremes give the first index; a NaN wins argmax, argmin and median alike (the
    first NaN's index), in a lane past the first 128 too; median ties give some equal entry."""
    x = torch.randn(5, 131, dtype=torch.float64).float().double()
    x[0, [7, 100]] = float("nan")
    x[1, 130] = float("nan")
    x[2, [3, 9, 120]] = 50.0 if op == "argmax" else -50.0
    x[3] = float("-inf")
    x[4, :] = torch.arange(131) // 2 % 5 * 1.0   # many entries equal each value
    got = run_indexed(executor, op, x, [1], False)
    want = indexed_reference(op, x, [1], False)
    if op != "median":
        assert torch.equal(got[0], want[0])
    else:   # rows 0-2: torch's index; rows 3-4 (ties): the index of an entry equal to it
        torch.testing.assert_close(got[0].double(), want[0], equal_nan=True, rtol=0, atol=0)
        assert torch.equal(got[1][:3], want[1][:3])
        assert all(x[r, got[1][r]] == want[0][r] for r in (3, 4))


@pytest.mark.parametrize("shape, dims, want", [((3, 0, 7), [1], "non-empty reduction"),
                                               ((3, 5, 7), [0, 2], "one dim, or")])
def test_indexed_reduction_bad_dims_are_typed_errors(shape, dims, want):
    with pytest.raises(DelegateError, match=want):
        get_op("argmax").infer([shape], {"dims": dims, "keepdim": False})


class IndexedZoo(nn.Module):
    """argmax, argmin and median (both forms) after a linear, the mean and sum of an integer
    input read as float32 (a cast before the reduction), and embedding_bag's per-bag max and
    mean of rows: one delegate call."""

    def __init__(self, dim: int = 13, include_last_offset: bool = False):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.bag_max = nn.EmbeddingBag(9, dim, mode="max")
        self.bag_mean = nn.EmbeddingBag(9, dim, include_last_offset=include_last_offset)

    def forward(self, x, counts, offsets):
        h = self.proj(x)
        values, indices = torch.median(h, 1, keepdim=True)
        as_float = torch.mean(counts, dtype=torch.float32) + torch.sum(counts, -1,
                                                                       dtype=torch.float32)
        ids = counts.reshape(-1)
        bags = torch.cat([self.bag_max(ids, offsets), self.bag_mean(ids, offsets)])
        return h.argmax(-1), h.argmin(), torch.median(h), values, indices, as_float, bags


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_indexed_reductions_and_integer_means_are_one_delegate_call(device):
    model = seeded(IndexedZoo())
    args = (torch.randn(3, 5, 13), torch.randint(0, 9, (4, 6)), torch.tensor([0, 5, 5, 17]))
    pm = lower(model, args, device=device)
    assert undelegated_ops(pm) == []
    assert delegate_calls(pm) == 1
    got, = run_pte(pm, [args], device)
    want = model(*args)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w.detach(), **tol("model", device))


def test_embedding_bag_with_include_last_offset_is_left_to_executorch():
    """torch's own kernels disagree on the last bag when offsets[-1] != len(indices), a
    runtime value, so the partitioner does not claim it."""
    model = seeded(IndexedZoo(include_last_offset=True))
    args = (torch.randn(3, 5, 13), torch.randint(0, 9, (4, 6)), torch.tensor([0, 5, 5, 17]))
    assert "aten._embedding_bag.out" in undelegated_ops(lower(model, args, device="cpu"))


class ReductionZoo(nn.Module):
    """Every reduction after a linear: an HF-style RMSNorm (mean.dim), sums, amax/amin, var,
    std, and full reductions (mean.default, sum over [])."""

    def __init__(self, dim: int = 13):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        h = self.proj(x)
        rms = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        spread = h.amax((0, 2), keepdim=True) - h.amin(-1, keepdim=True)
        stats = h.var(1, keepdim=True) + h.std((0, 2), correction=0, keepdim=True)
        whole = h.mean() + h.sum() * 0.01 + h.amax()
        return rms + spread + stats + h.sum((1,), keepdim=True) * 0.1 + whole


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_reduction_model_is_one_delegate_call_matching_eager(device):
    model = seeded(ReductionZoo())
    x = torch.randn(3, 5, 13)
    pm = lower(model, (x,), device=device)
    assert undelegated_ops(pm) == []
    assert delegate_calls(pm) == 1
    (got,), = run_pte(pm, [(x,)], device)
    torch.testing.assert_close(got, model(x).detach(), **tol("model", device))

"""Reductions (sum, mean, amax, amin, var) on both executors against float64 eager PyTorch:
dim lists, negative dims, [] meaning all, keepdim both ways, var's correction, NaN and Inf,
and a model using them end to end as one delegate call."""
import pytest
import torch
from torch import nn

from delegate.aot import lower, undelegated_ops
from delegate.errors import DelegateError
from delegate.models import seeded
from delegate.ops import get_op
from tests.test_kernels_cpu import run1, threads  # noqa: F401  (threads is a fixture)
from tests.test_kernels_wgsl import run_wgsl
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

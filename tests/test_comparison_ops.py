"""Comparisons (eq, ne, lt, le, gt, ge), where, casts and copy: one node through each
executor against torch on the same inputs. Their results are exact (a bool, a selected or
converted element), so the reference is torch itself and every check is equality; float
inputs are float32-exact and hold NaN, ±Inf, ±0 and ties. Shapes are prime-sized, broadcast,
and 0-d. WebGPU runs for real (lavapipe in CI) and holds int64 as i32: values stay in range.
"""
import pytest
import torch

from delegate.errors import DelegateError
from delegate.ops import get_op
from tests.test_kernels_cpu import threads  # noqa: F401  (the pool-size fixture)
from tests.test_nan_wgsl import nan_payloads, run_op

EXECUTORS = ["cpu", "webgpu"]
COMPARISONS = ["eq", "ne", "lt", "le", "gt", "ge"]
NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def ties_and_specials(*shape) -> torch.Tensor:
    """Small integers as floats (so operands tie often), with NaN, ±Inf and ±0 among them."""
    x = torch.randint(-3, 4, shape).float()
    flat = x.view(-1)
    specials = torch.tensor([NAN, INF, -INF, -0.0, 0.0])
    picks = torch.randperm(flat.numel())[: min(flat.numel(), 2 * len(specials))]
    flat[picks] = specials.repeat(2)[: len(picks)]
    return x


def check_exact(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
    if want.is_floating_point():   # every bit: NaN payloads and -0 too
        assert torch.equal(got.view(torch.int32), want.contiguous().view(torch.int32))
    else:
        assert torch.equal(got, want)


def compare(executor, op, a, b, other=None):
    return run_op(executor, op, [a, b], {"other": other}, out_dtype=torch.bool)[0]


# ---- comparisons ------------------------------------------------------------------------------
OPERANDS = {   # case -> (a, b): broadcasting both ways
    "float": lambda: (ties_and_specials(3, 1, 7), ties_and_specials(5, 1)),
    "int64": lambda: (torch.randint(-3, 4, (3, 1, 7)), torch.randint(-3, 4, (5, 1))),
    "int64-float": lambda: (torch.randint(-3, 4, (3, 1, 7)), ties_and_specials(5, 1)),
    "bool-int32": lambda: (torch.rand(3, 1, 7) > 0.5,
                           torch.randint(-1, 3, (5, 1), dtype=torch.int32)),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(OPERANDS))
@pytest.mark.parametrize("op", COMPARISONS)
def test_comparison_of_two_tensors_broadcasts_and_promotes_like_torch(op, case, executor):
    a, b = OPERANDS[case]()
    check_exact(compare(executor, op, a, b), getattr(torch, op)(a, b))


SCALARS = {   # case -> (tensor, scalar operand)
    "float-int": lambda: (ties_and_specials(7, 11), 2),
    "float-float": lambda: (ties_and_specials(7, 11), -1.5),
    "float-softplus_threshold": lambda: (torch.randn(1, 13, 2) * 30, 20),
    "int64-int": lambda: (torch.randint(-3, 4, (7, 11)), 0),
    "int64-float": lambda: (torch.randint(-3, 4, (7, 11)), 0.5),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(SCALARS))
@pytest.mark.parametrize("op", COMPARISONS)
def test_comparison_with_a_scalar_operand_like_torch(op, case, executor):
    a, other = SCALARS[case]()
    check_exact(compare(executor, op, a, None, other), getattr(torch, op)(a, other))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_nan_compares_unequal_to_everything(executor):
    a = torch.tensor([NAN, NAN, 1.0, NAN, INF])
    b = torch.tensor([NAN, 1.0, NAN, INF, NAN])
    for op in COMPARISONS:
        assert compare(executor, op, a, b).tolist() == [op == "ne"] * 5, op


@pytest.mark.parametrize("executor", EXECUTORS)
def test_integers_compare_exactly_where_float32_would_tie(executor):
    """2^30 + 1 and 2^30 are one float32; as i32 they differ. 0-d, as `input_pos[0] == 0`."""
    for value, other, want in ((0, 0, True), (5, 0, False), (2 ** 30 + 1, 2 ** 30, False)):
        got = compare(executor, "eq", torch.tensor(value), None, other)
        assert got.shape == () and bool(got) is want, (value, other)
    a, b = torch.tensor([2 ** 30 + 1, -7]), torch.tensor([2 ** 30, -7])
    check_exact(compare(executor, "gt", a, b), torch.tensor([True, False]))


def test_comparison_infer_rejects_shapes_that_do_not_broadcast():
    with pytest.raises(DelegateError, match="expected"):
        get_op("lt").infer([(3, 5), (7,)], {"other": None})


# ---- where ------------------------------------------------------------------------------------
@pytest.mark.parametrize("executor", EXECUTORS)
def test_where_broadcasts_condition_and_both_operands_bit_exactly(executor):
    c, a, b = torch.rand(3, 1, 7) > 0.5, nan_payloads(11, 1), nan_payloads(7)
    got = run_op(executor, "where", [c, a, b], {})[0]
    check_exact(got, torch.where(c, a, b))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_where_picks_integers_and_takes_0d_operands(executor):
    c = torch.rand(5, 11) > 0.5
    a, b = torch.randint(-100, 100, (11,)), torch.tensor(-1)
    got = run_op(executor, "where", [c, a, b], {}, out_dtype=torch.int64)[0]
    check_exact(got, torch.where(c, a, b))


def test_where_infer_rejects_shapes_that_do_not_broadcast():
    with pytest.raises(DelegateError, match="expected"):
        get_op("where").infer([(3, 5), (3, 5), (2, 5)], {})


def test_comparison_and_where_large_split_across_cpu_threads(threads):  # noqa: F811
    a, b = torch.randn(3, 97, 1031), torch.randn(97, 1)
    mask = compare("cpu", "ge", a, b)
    check_exact(mask, a >= b)
    check_exact(run_op("cpu", "where", [mask, a, b], {})[0], torch.where(mask, a, b))


# ---- cast -------------------------------------------------------------------------------------
DTYPES = [torch.float32, torch.int32, torch.int64, torch.bool]
VALUES = {   # what each source holds: floats with fractions, signs, ±0, NaN and ±Inf
    torch.float32: [-2.75, -1.0, -0.5, -0.0, 0.0, 0.25, 1.0, 3.5, 1e6, 2.0 ** 24 + 2],
    torch.int32: [-7, -1, 0, 1, 2, 13, 2 ** 24 + 1, -(2 ** 31), 2 ** 31 - 1],
    torch.int64: [-7, -1, 0, 1, 2, 13, 2 ** 24 + 1, -(2 ** 31), 2 ** 31 - 1],
    torch.bool: [True, False],
}
SPECIAL = [NAN, INF, -INF]   # float -> float or bool only: to an integer, C leaves them undefined


def _source(dtype, to) -> torch.Tensor:
    values = VALUES[dtype] + (SPECIAL if dtype == torch.float32 and to in (torch.float32,
                                                                            torch.bool) else [])
    flat = torch.tensor(values, dtype=dtype)
    return flat[torch.randint(0, len(values), (5, 11))]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dst", DTYPES, ids=str)
@pytest.mark.parametrize("src", DTYPES, ids=str)
def test_cast_converts_like_torch(src, dst, executor):
    x = _source(src, dst)
    got = run_op(executor, "cast", [x], {"dtype": str(dst).removeprefix("torch.")},
                 out_dtype=dst)[0]
    check_exact(got, x.to(dst))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_cast_of_a_0d_bool_to_float32_as_deltanet_resets_its_state(executor):
    for flag in (True, False):
        got = run_op(executor, "cast", [torch.tensor(flag)], {"dtype": "float32"})[0]
        check_exact(got, torch.tensor(float(flag)))


def test_cast_infer_rejects_a_dtype_outside_the_four_byte_set():
    with pytest.raises(DelegateError, match="cast dtype: expected"):
        get_op("cast").infer([(3, 5)], {"dtype": "float16"})


# ---- copy -------------------------------------------------------------------------------------
@pytest.mark.parametrize("executor", EXECUTORS)
def test_copy_broadcasts_src_to_dst_shape_bit_exactly(executor):
    dst, src = torch.randn(3, 11, 7), nan_payloads(11, 1)
    got = run_op(executor, "copy", [dst, src], {})[0]
    check_exact(got, dst.clone().copy_(src))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_copy_converts_src_to_dst_dtype(executor):
    dst, src = torch.zeros(7, 11, dtype=torch.int64), torch.randn(11) * 50
    got = run_op(executor, "copy", [dst, src], {}, out_dtype=torch.int64)[0]
    check_exact(got, dst.clone().copy_(src))


def test_copy_infer_rejects_src_that_does_not_broadcast_to_dst():
    with pytest.raises(DelegateError, match="expected"):
        get_op("copy").infer([(3, 5), (3, 7)], {})
    with pytest.raises(DelegateError, match="copy source shape: expected"):
        get_op("copy").infer([(5,), (3, 5)], {})   # src may not grow dst's rank

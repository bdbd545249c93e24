"""Bitwise and logical ops (issue #14): bitwise_and / or / xor / not on bool and integers,
logical_and / or / xor / not on any 4-byte dtype, one node through each executor.

References are numpy's bitwise and logical ufuncs on the same values (an implementation apart
from torch's), cast to torch's result dtype; every check is equality. Float operands of the
logical ops hold NaN, ±Inf, ±0. Shapes are prime-sized, broadcast and 0-d, plus the HF Llama
mask shape [1, 1, T, T]. WebGPU runs for real (lavapipe in CI) and holds int64 as i32, which
keeps the low 32 bits of and, or, xor and not exact for values in range.
"""
import numpy as np
import pytest
import torch
from torch import nn

from delegate.aot import lower, undelegated_ops
from delegate.ops import get_op
from tests.test_comparison_ops import check_exact, ties_and_specials
from tests.test_int_elementwise_shape import fx_call
from tests.test_kernels_cpu import threads  # noqa: F401  (the pool-size fixture)
from tests.test_models import run_pte
from tests.test_nan_wgsl import run_op

EXECUTORS = ["cpu", "webgpu"]
BITWISE = ["bitwise_and", "bitwise_or", "bitwise_xor"]
LOGICAL = ["logical_and", "logical_or", "logical_xor"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def ints(*shape, dtype=torch.int64):
    return torch.randint(-(2 ** 31), 2 ** 31 - 1, shape, dtype=dtype)


def mask(*shape):
    return torch.rand(shape) > 0.5


def numpy_ref(op: str, *xs) -> np.ndarray:
    return getattr(np, op)(*(x.numpy() if isinstance(x, torch.Tensor) else x for x in xs))


def want(op: str, *xs) -> torch.Tensor:
    """numpy's answer in torch's result dtype (bool for the logical ops)."""
    dtype = torch.bool if op.startswith("logical") else (
        torch.result_type(*xs) if len(xs) > 1 else xs[0].dtype)
    return torch.from_numpy(np.asarray(numpy_ref(op, *xs))).to(dtype)


def run(executor, op, a, b=None, other=None, out_dtype=torch.bool):
    ins = [a] if op.endswith("_not") else [a, b]
    attrs = {} if op.endswith("_not") else {"other": other}
    return run_op(executor, op, ins, attrs, out_dtype=out_dtype)[0]


# ---- bitwise and, or, xor ----------------------------------------------------------------------
BITWISE_OPERANDS = {   # case -> (a, b): broadcasting both ways
    "bool-bool": lambda: (mask(3, 1, 7), mask(5, 1)),
    "int64-int64": lambda: (ints(3, 1, 7), ints(5, 1)),
    "int32-int32": lambda: (ints(3, 1, 7, dtype=torch.int32), ints(5, 1, dtype=torch.int32)),
    "bool-int32": lambda: (mask(3, 1, 7), ints(5, 1, dtype=torch.int32)),
    # HF's padding mask: a 0-d bool against the causal mask [1, 1, T, T]
    "hf_mask": lambda: (torch.tensor(True), mask(1, 1, 13, 13)),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(BITWISE_OPERANDS))
@pytest.mark.parametrize("op", BITWISE)
def test_bitwise_op_of_two_tensors_broadcasts_and_promotes_like_torch(op, case, executor):
    a, b = BITWISE_OPERANDS[case]()
    ref = want(op, a, b)
    check_exact(run(executor, op, a, b, out_dtype=ref.dtype), ref)


BITWISE_SCALARS = {   # case -> (tensor, scalar operand as the lowering stores it, torch's scalar)
    "int64-negative": lambda: (ints(7, 11), -6, -6),
    "int32-mask_bits": lambda: (ints(7, 11, dtype=torch.int32), 0x0F0F, 0x0F0F),
    "bool-true": lambda: (mask(7, 11), 1, True),   # a bool scalar travels as 0 / 1
    "bool-false": lambda: (mask(7, 11), 0, False),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(BITWISE_SCALARS))
@pytest.mark.parametrize("op", BITWISE)
def test_bitwise_op_with_a_scalar_operand_like_torch(op, case, executor):
    a, stored, scalar = BITWISE_SCALARS[case]()
    ref = want(op, a, scalar)
    check_exact(run(executor, op, a, None, stored, out_dtype=ref.dtype), ref)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("x", [mask(5, 11), ints(5, 11), ints(5, 11, dtype=torch.int32),
                               torch.tensor(True)], ids=["bool", "int64", "int32", "0d_bool"])
def test_bitwise_not_is_not_on_bool_and_complement_on_integers(x, executor):
    check_exact(run(executor, "bitwise_not", x, out_dtype=x.dtype),
                torch.from_numpy(np.asarray(np.invert(x.numpy()))))


# ---- logical and, or, xor, not -----------------------------------------------------------------
LOGICAL_OPERANDS = {   # case -> (a, b): any dtype, read as x != 0
    "float-float": lambda: (ties_and_specials(3, 1, 7), ties_and_specials(5, 1)),
    "float-int64": lambda: (ties_and_specials(3, 1, 7), torch.randint(-1, 2, (5, 1))),
    "bool-int32": lambda: (mask(3, 1, 7), torch.randint(-1, 2, (5, 1), dtype=torch.int32)),
    "bool-bool_0d": lambda: (mask(1, 1, 13, 13), torch.tensor(False)),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(LOGICAL_OPERANDS))
@pytest.mark.parametrize("op", LOGICAL)
def test_logical_op_reads_each_operand_as_nonzero_and_gives_bool(op, case, executor):
    a, b = LOGICAL_OPERANDS[case]()
    check_exact(run(executor, op, a, b), want(op, a, b))


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("x", [ties_and_specials(5, 11), torch.randint(-1, 2, (5, 11)),
                               mask(5, 11)], ids=["float", "int64", "bool"])
def test_logical_not_is_x_equal_to_zero(x, executor):
    check_exact(run(executor, "logical_not", x), want("logical_not", x))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_negative_zero_is_false_and_nan_true(executor):
    x = torch.tensor([-0.0, 0.0, float("nan"), -float("nan"), float("inf"), 1e-45])
    check_exact(run(executor, "logical_not", x),
                torch.tensor([True, True, False, False, False, False]))


def test_large_bitwise_and_logical_ops_split_across_cpu_threads(threads):  # noqa: F811
    a, b = mask(3, 97, 1031), mask(97, 1)
    check_exact(run("cpu", "bitwise_and", a, b), want("bitwise_and", a, b))
    check_exact(run("cpu", "logical_not", a), want("logical_not", a))


# ---- the partitioner's view --------------------------------------------------------------------
def test_check_refuses_float_operands_and_scalars_of_bitwise_ops():
    i, f = torch.zeros(3, dtype=torch.int64), torch.zeros(3)
    check = get_op("bitwise_or").check
    assert "expected one of" in check(fx_call(torch.ops.aten.bitwise_or.Tensor, (f, i), f))
    assert "expected an int or bool" in check(fx_call(torch.ops.aten.bitwise_or.Scalar,
                                                      (i, 2.5), i))
    assert "WebGPU runs i32" in check(fx_call(torch.ops.aten.bitwise_or.Scalar, (i, 1 << 40), i))
    assert check(fx_call(torch.ops.aten.bitwise_or.Scalar_Tensor, (-(1 << 31), i), i)) is None


def test_check_refuses_a_logical_op_whose_result_is_not_bool():
    x = torch.zeros(3)
    node = fx_call(torch.ops.aten.logical_and.default, (x, x), x)   # logical_and(out=float)
    assert "expected torch.bool" in get_op("logical_and").check(node)


# ---- every edge form, delegated whole ----------------------------------------------------------
class EdgeForms(nn.Module):
    """Each edge form of the family once: Tensor, Scalar and Scalar_Tensor, not, logical."""

    def forward(self, m, i, x):
        return (m & True, ~m, ~i, i & 3, torch.bitwise_or(5, i), i ^ (i * 3), m | (x > 0),
                torch.logical_and(x, i), torch.logical_not(x), torch.logical_or(m, x),
                torch.logical_xor(i, m))


@pytest.fixture(scope="module")
def edge_forms_program():
    t = torch.export.Dim("T", min=2, max=32)
    example = (mask(3, 9), torch.randint(-9, 9, (3, 9)), torch.randn(3, 9))
    return lower(EdgeForms(), example, dynamic_shapes=({1: t},) * 3)


def test_every_edge_form_is_delegated(edge_forms_program):
    assert undelegated_ops(edge_forms_program) == []


@pytest.mark.parametrize("device", EXECUTORS)
def test_every_edge_form_matches_eager(edge_forms_program, device):
    x = ties_and_specials(3, 17)
    inputs = [(mask(3, 17), torch.randint(-1000, 1000, (3, 17)), x)]
    (got,) = run_pte(edge_forms_program, inputs, device)
    for g, w in zip(got, EdgeForms()(*inputs[0])):
        check_exact(g, w)

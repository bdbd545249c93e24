"""Integer and bool tensors through the elementwise and shape ops (issue #14): add, sub, mul,
div and neg with torch's promotion, and view, unsqueeze, squeeze, expand, permute, clone, cat,
split, slice and select as byte moves, one node through each executor.

References are computed apart from the code under test: integer results in float64 (exact
for the small values used here) cast to torch's result dtype, promoted float results in
float64 within the elementwise tolerance, and shape results by indexing the input itself.
Shapes are prime-sized and broadcast, plus the mask shapes of a tiny HF Llama (positions
[1, T], masks [1, 1, T, T]). WebGPU runs for real (lavapipe in CI) and holds int64 as i32:
values stay in range there, except where a test checks int32's wrap.
"""
import pytest
import torch
from torch import nn

from delegate.aot import lower, undelegated_ops
from delegate.ops import get_op
from delegate.ops.export import op_for_target, target_name
from tests.test_comparison_ops import check_exact
from tests.test_models import run_pte
from tests.test_nan_wgsl import run_op
from tests.tolerances import tol

EXECUTORS = ["cpu", "webgpu"]
I32_MAX = 2 ** 31 - 1


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def ints(*shape, dtype=torch.int64, lo=-50, hi=50):
    return torch.randint(lo, hi, shape, dtype=dtype)


def mask(*shape):
    return torch.rand(shape) > 0.5


def as_f64(x):
    return x if not isinstance(x, torch.Tensor) else x.double()


# ---- add, sub, mul: integers stay integers -----------------------------------------------------
def _exact(op, a, b, alpha=1):
    """a op alpha * b in float64, as torch's result dtype (values small enough to be exact)."""
    x, y = as_f64(a), as_f64(b)
    r = {"add": lambda: x + alpha * y, "sub": lambda: x - alpha * y, "mul": lambda: x * y}[op]()
    return r.to(torch.result_type(a, b))


INT_OPERANDS = {   # case -> (a, b), broadcasting both ways
    "int64-int64": lambda: (ints(3, 1, 7), ints(5, 1)),
    "int32-int32": lambda: (ints(3, 1, 7, dtype=torch.int32), ints(5, 1, dtype=torch.int32)),
    # a dimensioned int32 beside a 0-d int64 stays int32, as torch promotes
    "int32-0d_int64": lambda: (ints(11, dtype=torch.int32), torch.tensor(-7)),
    "bool-int64": lambda: (mask(3, 1, 7), ints(5, 1)),
    "hf_positions": lambda: (torch.arange(29), torch.tensor(0)),   # arange(T) + past length
}


# torch refuses sub with a bool operand, so no graph holds one
INT_OP_CASES = [(op, alpha, case) for op, alpha in (("add", 1), ("add", -3), ("sub", 2),
                                                    ("mul", None))
                for case in sorted(INT_OPERANDS) if not (op == "sub" and "bool" in case)]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("op,alpha,case", INT_OP_CASES)
def test_integer_binary_op_of_two_tensors_is_exact_in_the_promoted_integer_dtype(
        op, alpha, case, executor):
    a, b = INT_OPERANDS[case]()
    want = _exact(op, a, b, alpha or 1)
    attrs = {"other": None, **({} if alpha is None else {"alpha": alpha})}
    check_exact(run_op(executor, op, [a, b], attrs, out_dtype=want.dtype)[0], want)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integer_binary_op_with_a_scalar_operand_keeps_it_an_integer(dtype, executor):
    a = ints(7, 13, dtype=dtype)
    for op, other, alpha in (("add", 5, 1), ("sub", -4, 3), ("mul", -6, None), ("add", 0, -1)):
        want = _exact(op, a, other, alpha or 1)
        attrs = {"other": other, **({} if alpha is None else {"alpha": alpha})}
        check_exact(run_op(executor, op, [a, None], attrs, out_dtype=dtype)[0], want)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_integers_add_exactly_where_float32_would_round(executor):
    """2^30 + 1 is no float32; an integer op must not pass through one."""
    a = torch.tensor([2 ** 30 + 1, -(2 ** 30) - 3, 2 ** 24 + 1], dtype=torch.int64)
    got = run_op(executor, "add", [a, torch.tensor(2)], {"other": None, "alpha": 1},
                 out_dtype=torch.int64)[0]
    check_exact(got, torch.tensor([2 ** 30 + 3, -(2 ** 30) - 1, 2 ** 24 + 3]))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_int32_arithmetic_wraps_at_32_bits_as_torch_does(executor):
    a = torch.tensor([I32_MAX, -I32_MAX - 1, 65536], dtype=torch.int32)
    b = torch.tensor([1, 1, 65536], dtype=torch.int32)
    for op in ("add", "sub", "mul"):
        attrs = {"other": None, **({"alpha": 1} if op != "mul" else {})}
        got = run_op(executor, op, [a, b], attrs, out_dtype=torch.int32)[0]
        check_exact(got, getattr(torch, op)(a, b))


# ---- integers beside floats, and div: float32 results ------------------------------------------
FLOAT_CASES = {   # case -> (op, a, b or None, attrs, float64 reference)
    "int64*float": lambda: ("mul", ints(3, 1, 7), torch.randn(5, 1), {"other": None}),
    "float-bool": lambda: ("add", torch.randn(3, 7), mask(7), {"other": None, "alpha": 0.5}),
    "int64+float_scalar": lambda: ("add", ints(7, 11), None, {"other": 2.5, "alpha": 1.0}),
    "int64/int64": lambda: ("div", ints(5, 7), ints(7, lo=1, hi=9), {"other": None}),
    "int32/int_scalar": lambda: ("div", ints(5, 7, dtype=torch.int32), None, {"other": 3}),
}


def _float_reference(op, a, b, attrs):
    x, y = as_f64(a), as_f64(b if b is not None else attrs["other"])
    alpha = attrs.get("alpha", 1)
    return {"add": lambda: x + alpha * y, "sub": lambda: x - alpha * y, "mul": lambda: x * y,
            "div": lambda: x / y}[op]()


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(FLOAT_CASES))
def test_integer_beside_a_float_or_divided_gives_float32_as_torch_promotes(case, executor):
    op, a, b, attrs = FLOAT_CASES[case]()
    got = run_op(executor, op, [a, b], attrs)[0]
    want = _float_reference(op, a, b, attrs)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want.float(), **tol("elementwise", executor))


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integer_neg_is_exact(dtype, executor):
    a = ints(3, 29, dtype=dtype, lo=-1000, hi=1000)
    check_exact(run_op(executor, "neg", [a], {}, out_dtype=dtype)[0], (-a.double()).to(dtype))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_int32_neg_of_the_most_negative_wraps_to_itself(executor):
    a = torch.tensor([-I32_MAX - 1, I32_MAX, 0], dtype=torch.int32)
    check_exact(run_op(executor, "neg", [a], {}, out_dtype=torch.int32)[0], torch.neg(a))


# ---- the partitioner's view: what is claimed, what is refused, and why -------------------------
def _reasons(fn, *inputs) -> dict:
    """Edge target -> its op's support reason (None: claimed), for every call of fn."""
    from executorch.exir import to_edge

    class M(nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    graph = to_edge(torch.export.export(M(), inputs)).exported_program().graph
    return {target_name(n.target): op_for_target(n.target).check(n)
            for n in graph.nodes if n.op == "call_function" and op_for_target(n.target)}


def test_check_claims_integer_arithmetic_and_shape_ops():
    reasons = _reasons(lambda i, m: (torch.cat([i[:, :1] - 1, i], -1).unsqueeze(1) * 3,
                                     -i.view(-1), m.expand(2, 5, 7).permute(2, 0, 1).clone()),
                       ints(1, 7), mask(1, 7))
    assert reasons and all(r is None for r in reasons.values()), reasons


def fx_call(target, args: tuple, out: torch.Tensor, **kwargs) -> torch.fx.Node:
    """A call node as edge would hold it: tensor arguments (nested in lists too) become
    placeholders carrying them as meta values."""
    graph = torch.fx.Graph()

    def node_of(x):
        if isinstance(x, (list, tuple)):
            return [node_of(e) for e in x]
        if not isinstance(x, torch.Tensor):
            return x
        node = graph.placeholder(f"x{len(graph.nodes)}")
        node.meta["val"] = x
        return node

    call = graph.call_function(target, tuple(node_of(a) for a in args), kwargs)
    call.meta["val"] = out
    return call


@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_check_refuses_rounding_division(mode):
    i = ints(3, 5)
    node = fx_call(torch.ops.aten.div.Tensor_mode, (i, i), i, rounding_mode=mode)
    assert "rounding_mode" in get_op("div").check(node)


def test_check_refuses_an_integer_scalar_past_32_bits():
    i = ints(3, 5)
    for op, target in (("add", torch.ops.aten.add.Scalar), ("mul", torch.ops.aten.mul.Scalar)):
        assert "WebGPU runs i32" in get_op(op).check(fx_call(target, (i, 1 << 40), i))
        assert get_op(op).check(fx_call(target, (i, -(1 << 31)), i)) is None


def test_check_refuses_a_cat_of_mixed_dtypes():
    """Edge casts a cat's inputs to one dtype; a graph that does not is refused, not promoted."""
    parts = [torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.int64)]
    node = fx_call(torch.ops.aten.cat.default, (parts, 0), torch.zeros(2, 3))
    assert "no promotion" in get_op("cat").check(node)


# ---- shape ops move integers and bools unconverted ---------------------------------------------
SHAPE_CASES = {   # case -> (op, input, attrs, reference from the input)
    "view-int64": lambda: ("view", ints(1, 29), {"sizes": [-1]}, lambda x: x.reshape(-1)),
    "unsqueeze-int64": lambda: ("unsqueeze", ints(1, 29), {"dim": 1},
                                lambda x: x[:, None, :]),
    "squeeze-bool": lambda: ("squeeze", mask(1, 7, 1), {"dims": [0, 2]}, lambda x: x[0, :, 0]),
    "expand-int64": lambda: ("expand", ints(1, 29), {"sizes": [3, -1]},
                             lambda x: x.repeat(3, 1)),
    "expand-hf_mask": lambda: ("expand", mask(1, 1, 13, 13), {"sizes": [1, 1, 13, 13]},
                               lambda x: x),
    "expand-bool_rows": lambda: ("expand", mask(5, 1, 7), {"sizes": [2, 5, 3, 7]},
                                 lambda x: x.repeat(2, 1, 3, 1)),
    "permute-int32": lambda: ("permute", ints(3, 5, 7, dtype=torch.int32), {"dims": [2, 0, 1]},
                              lambda x: torch.stack([x[:, :, k] for k in range(7)])),
    "clone-bool": lambda: ("clone", mask(3, 11), {}, lambda x: x),
    "slice-int64": lambda: ("slice", ints(3, 29), {"dim": 1, "start": 2, "end": 27, "step": 3},
                            lambda x: x[:, 2:27:3]),
    "select-bool": lambda: ("select", mask(3, 5, 7), {"dim": 1, "index": -2},
                            lambda x: x[:, 3, :]),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(SHAPE_CASES))
def test_shape_op_moves_integers_and_bools_unconverted(case, executor):
    op, x, attrs, ref = SHAPE_CASES[case]()
    check_exact(run_op(executor, op, [x], attrs, out_dtype=x.dtype)[0], ref(x).contiguous())


@pytest.mark.parametrize("executor", EXECUTORS)
def test_cat_of_integers_as_hf_builds_its_position_ids(executor):
    """cat([pos[:, :1] - 1, pos], -1): int64 [1, 1] and [1, T] into [1, T + 1]."""
    first, pos = ints(1, 1), ints(1, 29)
    got = run_op(executor, "cat", [first, pos], {"dim": -1}, out_dtype=torch.int64)[0]
    check_exact(got, torch.tensor([[first.item()] + pos[0].tolist()]))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_split_of_bools_gives_each_piece(executor):
    x = mask(3, 12, 5)
    got = run_op(executor, "split", [x], {"split_sizes": [2, 7, 3], "dim": 1},
                 out_dtype=torch.bool)
    for piece, (a, b) in zip(got, ((0, 2), (2, 9), (9, 12))):
        check_exact(piece, x[:, a:b].contiguous())


def test_shape_ops_declare_every_four_byte_dtype():
    for name in ("view", "unsqueeze", "squeeze", "expand", "permute", "clone", "cat", "split",
                 "slice", "select"):
        assert set(get_op(name).dtypes) == {torch.float32, torch.int32, torch.int64,
                                            torch.bool}, name


# ---- a whole graph: mask and position arithmetic inside one delegate ---------------------------
class MaskArithmetic(nn.Module):
    """The integer and bool half of an HF attention mask, with positions and padding given."""

    def forward(self, pos, pad):
        t = pos.shape[-1]
        ids = torch.cat([pos[:, :1] - 1, pos], -1)        # int64 cat, sub
        step = (ids[:, 1:] - ids[:, :-1]) * 2 + 1         # sub, mul, add of int64
        causal = pos.unsqueeze(1) <= pos.unsqueeze(-1)    # unsqueezes of int64
        keep = causal.unsqueeze(1) & pad[:, None, None, :]
        return keep.expand(1, 1, t, t), step.view(-1), -ids


@pytest.fixture(scope="module")
def mask_program():
    t = torch.export.Dim("T", min=2, max=32)
    pos, pad = torch.arange(9).view(1, 9), torch.ones(1, 9, dtype=torch.bool)
    return lower(MaskArithmetic(), (pos, pad), dynamic_shapes=({1: t}, {1: t}))


def test_mask_arithmetic_is_delegated_whole(mask_program):
    assert undelegated_ops(mask_program) == []


@pytest.mark.parametrize("device", EXECUTORS)
def test_mask_arithmetic_matches_eager_at_two_lengths(mask_program, device):
    inputs = [(torch.arange(3, 3 + t).view(1, t) * 2, mask(1, t)) for t in (5, 32)]
    for (pos, pad), got in zip(inputs, run_pte(mask_program, inputs, device)):
        for g, w in zip(got, MaskArithmetic()(pos, pad)):
            check_exact(g, w.contiguous())

"""Every core CPU kernel against an independent float64 eager-PyTorch reference.

Kernels are called as the CPU executor calls them: output shapes from the op's infer, outputs
preallocated, scratch sized by the kernel's scratch_nbytes, torch held to one intra-op thread.
Shapes are prime-sized (3, 5, 7, 11, 13, 29, 97...) plus a few model shapes; the large cases run
with 1 and 2 pool threads so both the inline and the split paths are checked.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from delegate.errors import DelegateError, InputError
from delegate.ops import get_op
from kernels_cpu import get_kernel
from kernels_cpu import threadpool
from kernels_cpu.threadpool import get_pool, set_num_threads, single_threaded_torch
from tests.tolerances import tol

INT_MAX = 2 ** 63 - 1


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class PoolProbe:
    """The pool size under test, and how many calls really fanned out over several workers
    (the pool's, or BLAS's own threads on the pool's core count)."""

    def __init__(self, n: int):
        self.n, self.splits = n, 0


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request, monkeypatch):
    before = get_pool().num_threads
    set_num_threads(request.param)
    probe, pool = PoolProbe(request.param), get_pool()
    run_tasks = pool.run

    def counting_run(tasks):
        probe.splits += len(tasks) > 1
        run_tasks(tasks)

    monkeypatch.setattr(pool, "run", counting_run)
    enter = threadpool.torch_threads.__enter__

    def counting_enter(self):   # a large GEMM fans out inside BLAS, on the pool's core count
        probe.splits += self._n > 1
        return enter(self)

    monkeypatch.setattr(threadpool.torch_threads, "__enter__", counting_enter)
    yield probe
    set_num_threads(before)
    # the large cases exist to exercise the split path: they must not fall under a threshold
    assert probe.splits > 0 if probe.n > 1 else probe.splits == 0


def run(op: str, ins: list, **attrs) -> list:
    """Infer, allocate, and run one kernel exactly as the CPU executor does."""
    in_shapes = [None if t is None else tuple(t.shape) for t in ins]
    shapes = get_op(op).infer(in_shapes, attrs)
    outs = [torch.empty(s) for s in shapes]
    kernel = get_kernel(op)
    nbytes = kernel.scratch_nbytes(in_shapes, attrs, get_pool().num_threads) \
        if kernel.scratch_nbytes else 0
    with single_threaded_torch():
        kernel.fn(ins, outs, attrs, torch.empty(nbytes, dtype=torch.uint8))
    return outs


def run1(op: str, ins: list, **attrs) -> torch.Tensor:
    return run(op, ins, **attrs)[0]


def d(t):
    return t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def check(got: torch.Tensor, ref: torch.Tensor, family: str) -> None:
    assert tuple(got.shape) == tuple(ref.shape)
    torch.testing.assert_close(got.double(), ref.double(), **tol(family))


# ---- elementwise -----------------------------------------------------------------------------
BINARY_REF = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
BROADCAST_SHAPES = [((7, 13), (13,)), ((3, 1, 5), (1, 11, 5)), ((5,), (3, 5)), ((7, 29), ()),
                    ((1, 64, 256), (256,)), ((3, 97, 1), (1, 97, 256))]


def _operand(shape):
    return torch.rand(shape) + 0.5   # away from 0 so div stays well conditioned


@pytest.mark.parametrize("op", sorted(BINARY_REF))
@pytest.mark.parametrize("sa,sb", BROADCAST_SHAPES)
def test_binary_broadcasts_like_torch(op, sa, sb):
    a, b = torch.randn(sa), _operand(sb)
    check(run1(op, [a, b], other=None, **({"alpha": 1.0} if op in ("add", "sub") else {})),
          BINARY_REF[op](d(a), d(b)), "elementwise")


@pytest.mark.parametrize("op", ["add", "sub"])
@pytest.mark.parametrize("alpha", [0.5, 2.0, -3.0])
def test_add_sub_scale_other_by_alpha(op, alpha):
    a, b = torch.randn(11, 29), torch.randn(29)
    check(run1(op, [a, b], other=None, alpha=alpha), BINARY_REF[op](d(a), d(b), alpha=alpha),
          "elementwise")


@pytest.mark.parametrize("op", sorted(BINARY_REF))
def test_binary_scalar_operand(op):
    a = torch.randn(13, 31)
    attrs = {"other": 2.5, **({"alpha": 3.0} if op in ("add", "sub") else {})}
    ref = BINARY_REF[op](d(a), 2.5, **({"alpha": 3.0} if op in ("add", "sub") else {}))
    check(run1(op, [a, None], **attrs), ref, "elementwise")


def test_binary_large_splits_across_threads(threads):
    a, b = torch.randn(3, 97, 1031), torch.randn(97, 1)
    check(run1("add", [a, b], other=None, alpha=0.5), d(a) + 0.5 * d(b), "elementwise")
    check(run1("div", [a, b.abs() + 0.5], other=None), d(a) / (d(b).abs() + 0.5), "elementwise")


def test_binary_infer_rejects_non_broadcastable_shapes():
    with pytest.raises(DelegateError, match="expected"):
        get_op("add").infer([(3, 5), (7,)], {"other": None, "alpha": 1.0})
    with pytest.raises(DelegateError, match="expected"):
        get_op("mul").infer([(2, 3, 5), (3, 3, 5)], {"other": None})


UNARY = {
    "neg": ({}, torch.neg, "elementwise", torch.randn),
    "relu": ({}, torch.relu, "elementwise", torch.randn),
    "exp": ({}, torch.exp, "transcendental", torch.randn),
    "sigmoid": ({}, torch.sigmoid, "transcendental", torch.randn),
    "silu": ({}, F.silu, "transcendental", torch.randn),
    "tanh": ({}, torch.tanh, "transcendental", torch.randn),
    "rsqrt": ({}, torch.rsqrt, "transcendental", _operand),
    "gelu-none": ({"approximate": "none"}, F.gelu, "transcendental", torch.randn),
    "gelu-tanh": ({"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh"),
                  "transcendental", torch.randn),
    "pow-2": ({"exponent": 2}, lambda x: x ** 2, "transcendental", torch.randn),
    "pow-0.5": ({"exponent": 0.5}, lambda x: x ** 0.5, "transcendental", _operand),
    "pow--1.5": ({"exponent": -1.5}, lambda x: x ** -1.5, "transcendental", _operand),
    "abs": ({}, torch.abs, "elementwise", torch.randn),
    "sqrt": ({}, torch.sqrt, "transcendental", _operand),
    "log": ({}, torch.log, "transcendental", _operand),
    "log1p": ({}, torch.log1p, "transcendental", lambda s: torch.rand(s) * 5 - 0.99),
    "ceil": ({}, torch.ceil, "elementwise", lambda s: torch.randn(s) * 5),
    "floor": ({}, torch.floor, "elementwise", lambda s: torch.randn(s) * 5),
    "clamp-both": ({"min": -0.5, "max": 0.75}, lambda x: x.clamp(-0.5, 0.75), "elementwise",
                   torch.randn),
    "clamp-min": ({"min": 0.1, "max": None}, lambda x: x.clamp(min=0.1), "elementwise",
                  torch.randn),
    "leaky_relu-0.2": ({"negative_slope": 0.2}, lambda x: F.leaky_relu(x, 0.2), "elementwise",
                       torch.randn),
    "elu-1.3": ({"alpha": 1.3, "scale": 1.1, "input_scale": 0.9},
                lambda x: 1.1 * torch.where(x > 0, x, 1.3 * torch.expm1(0.9 * x)),
                "transcendental", torch.randn),
    "hardswish": ({}, F.hardswish, "elementwise", lambda s: torch.randn(s) * 4),
    "hardsigmoid": ({}, F.hardsigmoid, "elementwise", lambda s: torch.randn(s) * 4),
    "sin": ({}, torch.sin, "transcendental", lambda s: torch.randn(s) * 10),
    "cos": ({}, torch.cos, "transcendental", lambda s: torch.randn(s) * 10),
}


@pytest.mark.parametrize("case", sorted(UNARY))
@pytest.mark.parametrize("shape", [(7, 29), (3, 5, 11), (1, 64, 256)])
def test_unary_matches_float64(case, shape):
    attrs, ref, family, make = UNARY[case]
    x = make(shape)
    check(run1(case.split("-")[0], [x], **attrs), ref(d(x)), family)


@pytest.mark.parametrize("case", ["silu", "gelu-tanh", "exp"])
def test_unary_large_splits_across_threads(case, threads):
    attrs, ref, family, make = UNARY[case]
    x = make((3, 97, 1031))
    check(run1(case.split("-")[0], [x], **attrs), ref(d(x)), family)


# ---- linear ----------------------------------------------------------------------------------
# Weights scaled by 1/sqrt(K) as nn.Linear initialises them, so outputs are O(1): with
# unit-variance operands a K=256 float32 dot product alone drifts ~2e-5 from float64.
def weight(*shape, k=None):
    return torch.randn(shape) / math.sqrt(k or shape[-1])


@pytest.mark.parametrize("xs,n", [((3, 7, 29), 13), ((5, 31), 97), ((1, 64, 256), 256)])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_linear_matches_float64(xs, n, bias):
    x, w = torch.randn(xs), weight(n, xs[-1])
    b = torch.randn(n) if bias else None
    check(run1("linear", [x, w, b]), F.linear(d(x), d(w), d(b)), "matmul")


@pytest.mark.parametrize("m", [1, 29], ids=["gemv-cols", "gemm-rows"])
def test_linear_large_splits_across_threads(m, threads):
    x, w, b = torch.randn(1, m, 1024), weight(1031, 1024), torch.randn(1031)
    check(run1("linear", [x, w, b]), F.linear(d(x), d(w), d(b)), "matmul")


def _mm_case(m, k, n):
    a, b = torch.randn(m, k), weight(k, n, k=k)
    check(run1("mm", [a, b]), d(a) @ d(b), "matmul")


def _bmm_case(bsz, m, k, n):
    a, b = torch.randn(bsz, m, k), weight(bsz, k, n, k=k)
    check(run1("bmm", [a, b]), torch.bmm(d(a), d(b)), "matmul")


@pytest.mark.parametrize("m,k,n", [(3, 5, 7), (29, 31, 11), (1, 64, 256)])
def test_mm_matches_float64(m, k, n):
    _mm_case(m, k, n)


@pytest.mark.parametrize("m,k,n", [(1, 1024, 1031), (97, 128, 97)], ids=["cols", "rows"])
def test_mm_large_splits_across_threads(m, k, n, threads):
    _mm_case(m, k, n)


@pytest.mark.parametrize("bsz,m,k,n", [(3, 5, 7, 11), (4, 64, 64, 64)])
def test_bmm_matches_float64(bsz, m, k, n):
    _bmm_case(bsz, m, k, n)


@pytest.mark.parametrize("bsz,m,k,n", [(1, 97, 128, 97), (13, 29, 64, 97)],
                         ids=["rows", "batches"])
def test_bmm_large_splits_across_threads(bsz, m, k, n, threads):
    _bmm_case(bsz, m, k, n)


@pytest.mark.parametrize("bias_shape", [(11,), (7, 11), (7, 1)])
@pytest.mark.parametrize("beta,alpha", [(1.0, 1.0), (0.5, 2.0), (0.0, -1.0)])
def test_addmm_scales_bias_and_product(bias_shape, beta, alpha):
    c, a, b = torch.randn(bias_shape), torch.randn(7, 13), weight(13, 11, k=13)
    ref = torch.addmm(d(c), d(a), d(b), beta=beta, alpha=alpha)
    check(run1("addmm", [c, a, b], beta=beta, alpha=alpha), ref, "matmul")


def test_addmm_large_splits_across_threads(threads):
    c, a, b = torch.randn(1031), torch.randn(29, 256), weight(256, 1031, k=256)
    ref = torch.addmm(d(c), d(a), d(b), beta=0.5, alpha=2.0)
    check(run1("addmm", [c, a, b], beta=0.5, alpha=2.0), ref, "matmul")


@pytest.mark.parametrize("op,shapes", [
    ("linear", [(3, 7), (5, 11), None]),
    ("mm", [(3, 7), (5, 11)]),
    ("bmm", [(2, 3, 7), (2, 5, 11)]),
    ("bmm", [(2, 3, 7), (3, 7, 11)]),
    ("addmm", [(11,), (3, 7), (5, 11)]),
    ("addmm", [(4, 11), (3, 7), (7, 11)]),
])
def test_matmul_infer_rejects_mismatched_shapes(op, shapes):
    with pytest.raises(DelegateError, match="expected"):
        get_op(op).infer(shapes, {"beta": 1.0, "alpha": 1.0})


CONV_CASES = [
    # (x shape, weight shape, stride, padding, dilation, transposed, output_padding, groups)
    ((2, 3, 29), (5, 3, 3), [1], [1], [1], False, [0], 1),
    ((1, 6, 31), (6, 2, 5), [2], [2], [1], False, [0], 3),
    ((2, 3, 11, 13), (7, 3, 3, 3), [1, 2], [1, 0], [1, 1], False, [0, 0], 1),
    ((1, 4, 13, 11), (4, 1, 3, 5), [2, 1], [1, 2], [2, 1], False, [0, 0], 4),
    ((2, 5, 7, 5), (5, 3, 3, 3), [2, 2], [1, 1], [1, 1], True, [1, 0], 1),
    ((1, 3, 17), (3, 7, 4), [3], [1], [1], True, [2], 1),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[f"{len(c[0]) - 2}d-{i}" for i, c in enumerate(CONV_CASES)])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_convolution_matches_float64(case, bias):
    _check_convolution(case, bias)


def test_convolution_batch_splits_across_threads(threads):
    _check_convolution(((4, 3, 37, 31), (8, 3, 3, 3), [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
                       True)


def _check_convolution(case, bias):
    xs, ws, stride, padding, dilation, transposed, out_pad, groups = case
    x, w = torch.randn(xs), weight(*ws, k=ws[1] * math.prod(ws[2:]))
    b = torch.randn(ws[1] * groups if transposed else ws[0]) if bias else None
    attrs = dict(stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                 output_padding=out_pad, groups=groups)
    args = (d(x), d(w), d(b))
    if transposed:
        fn = F.conv_transpose1d if len(xs) == 3 else F.conv_transpose2d
        ref = fn(*args, stride=stride, padding=padding, output_padding=out_pad, groups=groups,
                 dilation=dilation)
    else:
        fn = F.conv1d if len(xs) == 3 else F.conv2d
        ref = fn(*args, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check(run1("convolution", [x, w, b], **attrs), ref, "matmul")


# ---- normalization ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape,normalized", [((3, 7, 29), (29,)), ((3, 5, 7), (5, 7)),
                                              ((1, 64, 256), (256,))])
@pytest.mark.parametrize("eps", [None, 1e-6])
@pytest.mark.parametrize("weight", [True, False], ids=["w", "now"])
def test_rms_norm_matches_float64(shape, normalized, eps, weight):
    x = torch.randn(shape)
    w = torch.randn(normalized) if weight else None
    ref_eps = torch.finfo(torch.float32).eps if eps is None else eps   # torch: eps=None
    ref = F.rms_norm(d(x), normalized, d(w), eps=ref_eps)
    check(run1("rms_norm", [x, w], normalized_shape=list(normalized), eps=eps), ref,
          "normalization")


def test_rms_norm_large_splits_across_threads(threads):
    x, w = torch.randn(7, 97, 256), torch.randn(256)
    ref = F.rms_norm(d(x), (256,), d(w), eps=1e-5)
    check(run1("rms_norm", [x, w], normalized_shape=[256], eps=1e-5), ref, "normalization")


@pytest.mark.parametrize("shape,normalized", [((3, 7, 29), (29,)), ((3, 5, 7), (5, 7)),
                                              ((1, 64, 256), (256,))])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_layer_norm_matches_float64(shape, normalized, affine):
    x = torch.randn(shape)
    w, b = (torch.randn(normalized), torch.randn(normalized)) if affine else (None, None)
    ref = F.layer_norm(d(x), normalized, d(w), d(b), eps=1e-5)
    got = run1("layer_norm", [x, w, b], normalized_shape=list(normalized), eps=1e-5, stats=False)
    check(got, ref, "normalization")


def test_native_layer_norm_also_returns_mean_and_rstd(threads):
    x, w, b = torch.randn(7, 97, 256), torch.randn(256), torch.randn(256)
    out, mean, rstd = run("layer_norm", [x, w, b], normalized_shape=[256], eps=1e-5, stats=True)
    xd = d(x)
    ref_mean = xd.mean(-1, keepdim=True)
    ref_rstd = (xd.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
    check(out, F.layer_norm(xd, (256,), d(w), d(b), eps=1e-5), "normalization")
    check(mean, ref_mean, "normalization")
    check(rstd, ref_rstd, "normalization")


def test_norm_infer_rejects_mismatched_normalized_shape():
    with pytest.raises(DelegateError, match="expected"):
        get_op("rms_norm").infer([(3, 7), (7,)], {"normalized_shape": [5], "eps": None})
    with pytest.raises(DelegateError, match="expected"):
        get_op("layer_norm").infer([(3, 7), (5,), None],
                                   {"normalized_shape": [7], "eps": 1e-5, "stats": False})


# ---- softmax ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,dim", [((3, 7, 29), -1), ((3, 7, 29), 0), ((3, 7, 29), 1),
                                       ((1, 4, 64, 64), -1), ((97,), 0)])
def test_softmax_matches_float64(shape, dim):
    x = torch.randn(shape) * 3
    check(run1("softmax", [x], dim=dim), torch.softmax(d(x), dim), "softmax")


@pytest.mark.parametrize("shape,dim", [((7, 97, 256), -1), ((1, 97, 2053), 1)],
                         ids=["rows", "columns"])
def test_softmax_large_splits_across_threads(shape, dim, threads):
    x = torch.randn(shape) * 3
    check(run1("softmax", [x], dim=dim), torch.softmax(d(x), dim), "softmax")


def test_softmax_infer_rejects_bad_dim():
    with pytest.raises(DelegateError, match="expected"):
        get_op("softmax").infer([(3, 5)], {"dim": 2})


# ---- shape -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,sizes", [((7, 29), [-1]), ((3, 5, 7), [5, -1]),
                                         ((3, 5, 7), [105, 1]), ((1, 64, 256), [1, 64, 4, 64])])
def test_view_resolves_minus_one(shape, sizes):
    x = torch.randn(shape)
    check(run1("view", [x], sizes=sizes), x.reshape(sizes), "shape")


@pytest.mark.parametrize("sizes", [[4, 26], [-1, 4], [-1, -1, 105]])
def test_view_infer_rejects_numel_mismatch(sizes):
    with pytest.raises(DelegateError, match="expected"):
        get_op("view").infer([(3, 5, 7)], {"sizes": sizes})


@pytest.mark.parametrize("dims", [[2, 0, 1], [-1, 0, 1], [0, 2, 1]])
def test_permute_matches_torch(dims):
    x = torch.randn(3, 5, 7)
    check(run1("permute", [x], dims=dims), x.permute(dims), "shape")


def test_permute_large_splits_across_threads(threads):
    x = torch.randn(1, 97, 8, 512)
    check(run1("permute", [x], dims=[0, 2, 1, 3]), x.permute(0, 2, 1, 3), "shape")


@pytest.mark.parametrize("dim,start,end,step", [
    (1, 1, INT_MAX, 1), (2, 0, INT_MAX, 2), (1, -5, -1, 1), (0, None, None, 3),
    (-1, 3, 100, 5), (1, 7, 3, 1), (1, -100, 4, 2),
])
def test_slice_clamps_like_torch(dim, start, end, step):
    x = torch.randn(5, 11, 13)
    want = x[(slice(None),) * (dim % 3) + (slice(start, end, step),)]
    check(run1("slice", [x], dim=dim, start=start, end=end, step=step), want, "shape")


@pytest.mark.parametrize("dim,index", [(1, -1), (0, 2), (-1, -13), (2, 12)])
def test_select_takes_negative_index(dim, index):
    x = torch.randn(5, 11, 13)
    check(run1("select", [x], dim=dim, index=index), x.select(dim, index), "shape")


def test_select_infer_rejects_out_of_range_index():
    with pytest.raises(DelegateError, match="expected"):
        get_op("select").infer([(5, 11)], {"dim": 1, "index": 11})


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_joins_three_inputs(dim):
    shapes = [[3, 5, 7], [3, 5, 7], [3, 5, 7]]
    for s, extra in zip(shapes, (2, 11, 1)):
        s[dim] = extra
    xs = [torch.randn(s) for s in shapes]
    check(run1("cat", xs, dim=dim), torch.cat(xs, dim), "shape")


def test_cat_infer_rejects_mismatched_shapes():
    with pytest.raises(DelegateError, match="expected"):
        get_op("cat").infer([(3, 5), (3, 7), (4, 5)], {"dim": 1})


@pytest.mark.parametrize("shape,sizes", [((3, 1, 7), [-1, 5, -1]), ((7, 1), [2, 7, 13]),
                                         ((1,), [29])])
def test_expand_broadcasts_and_keeps_minus_one(shape, sizes):
    x = torch.randn(shape)
    check(run1("expand", [x], sizes=sizes), x.expand(sizes), "shape")


def test_expand_infer_rejects_non_singleton_growth():
    with pytest.raises(DelegateError, match="expected"):
        get_op("expand").infer([(3, 2)], {"sizes": [3, 5]})


@pytest.mark.parametrize("dim", [0, 2, -1, -4])
def test_unsqueeze_inserts_dim(dim):
    x = torch.randn(3, 5, 7)
    check(run1("unsqueeze", [x], dim=dim), x.unsqueeze(dim), "shape")


@pytest.mark.parametrize("dims", [[1], [1, 3], [0, 1, 2, 3], [2]])
def test_squeeze_drops_only_size_one_dims(dims):
    x = torch.randn(3, 1, 7, 1)
    check(run1("squeeze", [x], dims=dims), x.squeeze(tuple(dims)), "shape")


def test_split_writes_every_piece():
    x = torch.randn(3, 29, 5)
    outs = run("split", [x], split_sizes=[7, 11, 11], dim=-2)
    for got, want in zip(outs, torch.split(x, [7, 11, 11], dim=1)):
        check(got, want, "shape")
    with pytest.raises(DelegateError, match="expected"):
        get_op("split").infer([(3, 29)], {"split_sizes": [7, 11], "dim": 1})


def test_clone_copies():
    x = torch.randn(3, 5, 7)
    check(run1("clone", [x]), x, "shape")


# ---- embedding -------------------------------------------------------------------------------
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("vocab,dim,idx_shape", [(97, 13, (3, 5)), (1031, 256, (1, 64)),
                                                  (11, 7, (29,))])
def test_embedding_gathers_rows(index_dtype, vocab, dim, idx_shape):
    w = torch.randn(vocab, dim)
    idx = torch.randint(0, vocab, idx_shape, dtype=index_dtype)
    check(run1("embedding", [w, idx]), F.embedding(idx.long(), d(w)), "embedding")


def test_embedding_rejects_out_of_range_index():
    w, idx = torch.randn(11, 7), torch.tensor([[0, 11]])
    with pytest.raises(InputError, match="expected"):
        run1("embedding", [w, idx])


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding", [None, 5])
def test_embedding_bag_reduces_each_bag(mode, padding):
    from tests.test_kernels_wgsl import BAGS, embedding_bag_reference

    w, (idx, offsets) = torch.randn(11, 7), BAGS
    got = run1("embedding_bag", [w, idx, offsets.int()], mode=mode,
               padding_idx=-1 if padding is None else padding)
    check(got, embedding_bag_reference(w, idx, offsets, mode, padding), "reduction")


# ---- attention -------------------------------------------------------------------------------
def sdpa_ref(q, k, v, mask=None, **kw):
    return F.scaled_dot_product_attention(d(q), d(k), d(v), attn_mask=d(mask), **kw)


def sdpa_run(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False):
    return run1("sdpa", [q, k, v, mask], is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def qkv(b, hq, hkv, L, S, e, ev):
    return torch.randn(b, hq, L, e), torch.randn(b, hkv, S, e), torch.randn(b, hkv, S, ev)


@pytest.mark.parametrize("L,S", [(5, 5), (5, 11), (11, 5), (1, 97)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_matches_float64(L, S, causal):
    q, k, v = qkv(2, 3, 3, L, S, 7, 13)
    check(sdpa_run(q, k, v, is_causal=causal), sdpa_ref(q, k, v, is_causal=causal), "attention")


def test_sdpa_takes_explicit_scale():
    q, k, v = qkv(1, 3, 3, 5, 7, 11, 11)
    check(sdpa_run(q, k, v, scale=0.3), sdpa_ref(q, k, v, scale=0.3), "attention")


@pytest.mark.parametrize("mask_shape", [(5, 11), (2, 1, 5, 11), (2, 3, 1, 11)])
def test_sdpa_bool_mask_hides_keys(mask_shape):
    q, k, v = qkv(2, 3, 3, 5, 11, 7, 7)
    mask = torch.rand(mask_shape) > 0.3
    mask[..., 0] = True    # keep a key per row; the all-masked case has its own test
    check(sdpa_run(q, k, v, mask), sdpa_ref(q, k, v, mask), "attention")


@pytest.mark.parametrize("mask_shape", [(5, 11), (2, 3, 5, 11)])
def test_sdpa_float_mask_is_added(mask_shape):
    q, k, v = qkv(2, 3, 3, 5, 11, 7, 7)
    mask = torch.randn(mask_shape)
    mask[..., 3] = float("-inf")
    check(sdpa_run(q, k, v, mask), sdpa_ref(q, k, v, mask), "attention")


def test_sdpa_fully_masked_row_gives_zeros_like_torch():
    q, k, v = qkv(1, 2, 2, 5, 7, 3, 3)
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False
    got = sdpa_run(q, k, v, mask)
    assert torch.all(got[:, :, 2] == 0)
    check(got, sdpa_ref(q, k, v, mask), "attention")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_grouped_query_heads(causal):
    q, k, v = qkv(2, 6, 2, 5, 7, 11, 13)
    ref = sdpa_ref(q, k, v, is_causal=causal, enable_gqa=True)
    check(sdpa_run(q, k, v, is_causal=causal, enable_gqa=True), ref, "attention")


@pytest.mark.parametrize("hq,hkv,L,S", [(4, 4, 64, 64), (4, 4, 1, 1031), (8, 2, 1, 1031)],
                         ids=["prefill", "decode", "gqa-decode"])
def test_sdpa_model_shape_splits_across_threads(hq, hkv, L, S, threads):
    q, k, v = qkv(1, hq, hkv, L, S, 64, 64)
    causal, gqa = L == S, hq != hkv
    ref = sdpa_ref(q, k, v, is_causal=causal, enable_gqa=gqa)
    check(sdpa_run(q, k, v, is_causal=causal, enable_gqa=gqa), ref, "attention")


@pytest.mark.parametrize("shapes,attrs", [
    ([(1, 4, 5, 8), (1, 3, 7, 8), (1, 3, 7, 8), None], {"enable_gqa": True}),
    ([(1, 4, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8), None], {"enable_gqa": False}),
    ([(1, 2, 5, 8), (1, 2, 7, 6), (1, 2, 7, 8), None], {}),
    ([(1, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8), (5, 6)], {}),
])
def test_sdpa_infer_rejects_incompatible_shapes(shapes, attrs):
    with pytest.raises(DelegateError, match="expected"):
        get_op("sdpa").infer(shapes, {"is_causal": False, "scale": None, **attrs})

"""Every WGSL kernel, run for real through the WebGPU executor (lavapipe in CI), against eager
PyTorch in float64 on prime-sized shapes. Tolerances come from tests/tolerances.py.

Nothing here skips: without an adapter these tests fail, as CI must run them for real."""
import pytest
import torch
import torch.nn.functional as F

import kernels_wgsl
from delegate import ops as registry
from delegate.ir import Graph, Node, TensorValue
from tests.tolerances import tol

def single_op_graph(op: str, ins: list, attrs: dict, consts=(), out_dtype=torch.float32) -> tuple:
    """(graph, weights, runtime inputs) for one node; inputs at positions in `consts` become
    weights (named constants), the rest graph inputs. None is an absent optional input;
    out_dtype is every output's dtype."""
    g, weights, feed, ids = Graph(), {}, [], []
    for i, t in enumerate(ins):
        if t is None:
            ids.append(-1)
            continue
        key = f"w{i}" if i in consts else None
        ids.append(g.add_value(TensorValue(t.dtype, tuple(t.shape), tuple(t.shape), key)))
        if key:
            weights[key] = t
        else:
            g.inputs.append(ids[-1])
            feed.append(t)
    shapes = registry.get_op(op).infer([None if t is None else tuple(t.shape) for t in ins], attrs)
    outs = [g.add_value(TensorValue(out_dtype, tuple(s), tuple(s))) for s in shapes]
    g.nodes.append(Node(op, ids, outs, dict(attrs)))
    g.outputs = outs
    return g, weights, feed


def run_wgsl(op: str, ins: list, attrs: dict, consts=()) -> list:
    from delegate.runtime.webgpu_executor import WebGpuExecutor

    ins32 = [None if t is None else (t.float() if t.is_floating_point() else t) for t in ins]
    graph, weights, feed = single_op_graph(op, ins32, attrs, consts)
    ex = WebGpuExecutor(graph, weights)
    try:
        return ex.execute(feed)
    finally:
        ex.destroy()


def check(got, want, family: str):
    torch.testing.assert_close(got, want.to(got.dtype), **tol(family, "webgpu"))


def rand(*shape):
    return torch.randn(*shape, dtype=torch.float64)


# ---- elementwise --------------------------------------------------------------------------
@pytest.mark.parametrize("op, ref", [("add", lambda a, b: a + 2.5 * b), ("sub", lambda a, b: a - 2.5 * b),
                                     ("mul", torch.mul), ("div", torch.div)])
def test_binary_broadcasts_both_operands(op, ref):
    a, b = rand(3, 1, 7), rand(5, 1)
    if op == "div":
        b = b.abs() + 0.5
    attrs = {"other": None, **({"alpha": 2.5} if op in ("add", "sub") else {})}
    check(run_wgsl(op, [a, b], attrs)[0], ref(a, b), "elementwise")


def test_binary_with_scalar_operand():
    a = rand(11, 13)
    check(run_wgsl("sub", [a, None], {"other": 3.0, "alpha": -2.0})[0], a + 6.0, "elementwise")
    check(run_wgsl("div", [a, None], {"other": 7.0})[0], a / 7.0, "elementwise")


def test_binary_reads_a_weight_operand():
    a, w = rand(5, 7), rand(7)
    check(run_wgsl("mul", [a, w], {"other": None}, consts={1})[0], a * w, "elementwise")


def positive(*shape):
    return rand(*shape).abs() + 0.05


def scaled(k):
    return lambda *shape: rand(*shape) * k


UNARY = {   # case (op, then "-" and a variant) -> (attrs, float64 reference, family, input maker)
    "neg": ({}, torch.neg, "elementwise", scaled(3)),
    "relu": ({}, torch.relu, "elementwise", scaled(3)),
    "abs": ({}, torch.abs, "elementwise", scaled(3)),
    "ceil": ({}, torch.ceil, "elementwise", scaled(5)),
    "floor": ({}, torch.floor, "elementwise", scaled(5)),
    "exp": ({}, torch.exp, "transcendental", scaled(3)),
    "sigmoid": ({}, torch.sigmoid, "transcendental", scaled(3)),
    "tanh": ({}, torch.tanh, "transcendental", scaled(3)),
    "silu": ({}, F.silu, "transcendental", scaled(3)),
    "sqrt": ({}, torch.sqrt, "transcendental", positive),
    "log": ({}, torch.log, "transcendental", positive),
    # both of the kernel's routes: the series for |x| < 1/4 and log(1 + x) beyond
    "log1p": ({}, torch.log1p, "transcendental", lambda *shape: positive(*shape) * 3 - 0.99),
    "sin": ({}, torch.sin, "transcendental", scaled(10)),
    "cos": ({}, torch.cos, "transcendental", scaled(10)),
    # rotary angles: positions times frequencies, far outside [-pi, pi]
    "sin-large": ({}, torch.sin, "transcendental", scaled(3000)),
    "cos-large": ({}, torch.cos, "transcendental", scaled(3000)),
    "hardswish": ({}, F.hardswish, "elementwise", scaled(4)),
    "hardsigmoid": ({}, F.hardsigmoid, "elementwise", scaled(4)),
    "clamp-both": ({"min": -0.5, "max": 0.75}, lambda x: x.clamp(-0.5, 0.75), "elementwise",
                   scaled(1)),
    "clamp-min": ({"min": 0.1, "max": None}, lambda x: x.clamp(min=0.1), "elementwise",
                  scaled(1)),
    "clamp-max": ({"min": None, "max": -0.2}, lambda x: x.clamp(max=-0.2), "elementwise",
                  scaled(1)),
    "leaky_relu-0.2": ({"negative_slope": 0.2}, lambda x: F.leaky_relu(x, 0.2), "elementwise",
                       scaled(3)),
    "elu-1.3": ({"alpha": 1.3, "scale": 1.1, "input_scale": 0.9},
                lambda x: 1.1 * torch.where(x > 0, x, 1.3 * torch.expm1(0.9 * x)),
                "transcendental", scaled(3)),
    # |x| < 1e-2: the Taylor branch of the kernel's expm1
    "elu-small": ({"alpha": 1.0, "scale": 1.0, "input_scale": 1.0},
                  lambda x: torch.where(x > 0, x, torch.expm1(x)), "transcendental",
                  scaled(1e-3)),
}


@pytest.mark.parametrize("shape", [(3, 5, 7), (1, 64, 256)])
@pytest.mark.parametrize("case", sorted(UNARY))
def test_unary(case, shape):
    attrs, ref, family, make = UNARY[case]
    x = make(*shape).float().double()   # float32-exact, so the reference sees the kernel's input
    check(run_wgsl(case.split("-")[0], [x], attrs)[0], ref(x), family)


def test_tanh_and_sigmoid_saturate_without_nan():
    x = torch.tensor([-100.0, -30.0, 0.0, 30.0, 100.0], dtype=torch.float64)
    check(run_wgsl("tanh", [x], {})[0], torch.tanh(x), "transcendental")
    check(run_wgsl("sigmoid", [x], {})[0], torch.sigmoid(x), "transcendental")


def test_rsqrt():
    x = rand(13, 11).abs() + 0.1
    check(run_wgsl("rsqrt", [x], {})[0], torch.rsqrt(x), "transcendental")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    x = rand(5, 29) * 3
    check(run_wgsl("gelu", [x], {"approximate": approximate})[0],
          F.gelu(x, approximate=approximate), "transcendental")


@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5, -1.0])
def test_pow_scalar_exponent(exponent):
    x = rand(7, 11)
    if exponent in (0.5, -1.0):
        x = x.abs() + 0.25
    check(run_wgsl("pow", [x], {"exponent": exponent})[0], x ** exponent, "transcendental")


# ---- copy family --------------------------------------------------------------------------
def test_permute():
    x = rand(3, 5, 7, 2)
    check(run_wgsl("permute", [x], {"dims": [2, 0, 3, 1]})[0], x.permute(2, 0, 3, 1), "shape")


def test_expand():
    x = rand(3, 1, 7)
    check(run_wgsl("expand", [x], {"sizes": [2, 3, 5, -1]})[0], x.expand(2, 3, 5, 7), "shape")


@pytest.mark.parametrize("start, end, step", [(1, None, 2), (-4, -1, 1), (0, 100, 3)])
def test_slice(start, end, step):
    x = rand(5, 11, 3)
    want = x[:, slice(start, end, step)]
    attrs = {"dim": 1, "start": start, "end": end, "step": step}
    check(run_wgsl("slice", [x], attrs)[0], want, "shape")


def test_select_with_negative_index():
    x = rand(5, 7, 3)
    check(run_wgsl("select", [x], {"dim": 1, "index": -2})[0], x[:, -2], "shape")


def test_cat_of_three():
    xs = [rand(3, k, 5) for k in (2, 7, 1)]
    check(run_wgsl("cat", xs, {"dim": 1})[0], torch.cat(xs, 1), "shape")


def test_split():
    x = rand(3, 11)
    got = run_wgsl("split", [x], {"dim": 1, "split_sizes": [2, 5, 4]})
    for g, w in zip(got, x.split([2, 5, 4], 1)):
        check(g, w, "shape")


@pytest.mark.parametrize("op, attrs, ref", [
    ("view", {"sizes": [7, -1]}, lambda x: x.reshape(7, -1)),
    ("unsqueeze", {"dim": 1}, lambda x: x.unsqueeze(1)),
    ("squeeze", {"dims": [1]}, lambda x: x.squeeze(1)),
    ("clone", {}, lambda x: x.clone()),
])
def test_views_are_metadata(op, attrs, ref):
    x = rand(5, 1, 7) if op == "squeeze" else rand(5, 7)
    assert kernels_wgsl.get_kernel(op).alias
    check(run_wgsl(op, [x], attrs)[0], ref(x), "shape")


# ---- matmul -------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_linear_reads_weight_transposed_in_place(bias):
    x, w, b = rand(2, 67, 37), rand(71, 37), rand(71)
    got = run_wgsl("linear", [x, w, b if bias else None], {}, consts={1, 2})[0]
    check(got, F.linear(x, w, b if bias else None), "matmul")


def test_linear_single_row():
    x, w = rand(1, 29), rand(13, 29)
    check(run_wgsl("linear", [x, w, None], {}, consts={1})[0], F.linear(x, w), "matmul")


def test_mm():
    a, b = rand(67, 19), rand(19, 131)
    check(run_wgsl("mm", [a, b], {})[0], a @ b, "matmul")


def test_bmm():
    a, b = rand(3, 5, 17), rand(3, 17, 7)
    check(run_wgsl("bmm", [a, b], {})[0], a @ b, "matmul")


@pytest.mark.parametrize("bias_shape", [(13,), (11, 13), (11, 1)])
def test_addmm(bias_shape):
    bias, a, b = rand(*bias_shape), rand(11, 7), rand(7, 13)
    got = run_wgsl("addmm", [bias, a, b], {"alpha": 0.5, "beta": 2.0})[0]
    check(got, torch.addmm(bias, a, b, alpha=0.5, beta=2.0), "matmul")


def test_addmm_with_zero_beta_ignores_nan_bias():
    bias, a, b = torch.full((5,), float("nan"), dtype=torch.float64), rand(3, 7), rand(7, 5)
    check(run_wgsl("addmm", [bias, a, b], {"alpha": 1.0, "beta": 0.0})[0], a @ b, "matmul")


# ---- softmax and norms -------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_softmax_any_dim(dim):
    x = rand(3, 5, 7) * 4
    check(run_wgsl("softmax", [x], {"dim": dim})[0], torch.softmax(x, dim), "softmax")


def test_softmax_long_row():
    x = rand(3, 257) * 10
    check(run_wgsl("softmax", [x], {"dim": -1})[0], torch.softmax(x, -1), "softmax")


# rows of f32 lanes (131), of vec4 lanes held in registers (2048: Llama's, 132), and longer
# than the registers hold (6000: the rest is read again from memory)
@pytest.mark.parametrize("d", [131, 132, 2048, 6000])
@pytest.mark.parametrize("weight, eps", [(True, 1e-6), (False, None)])
def test_rms_norm(weight, eps, d):
    x, w = rand(3, 5, d), rand(d)
    attrs = {"normalized_shape": [d], "eps": eps}
    got = run_wgsl("rms_norm", [x, w if weight else None], attrs, consts={1})[0]
    check(got, F.rms_norm(x, [d], w if weight else None, eps), "normalization")


@pytest.mark.parametrize("d", [131, 2048, 6000])
def test_layer_norm_rows_in_registers_and_beyond(d):
    x, w, b = rand(3, d) + 3, rand(d), rand(d)
    attrs = {"normalized_shape": [d], "eps": 1e-5, "stats": True}
    got = run_wgsl("layer_norm", [x, w, b], attrs, consts={1, 2})
    for g, want in zip(got, torch.native_layer_norm(x, [d], w, b, 1e-5)):
        check(g, want.reshape(g.shape), "normalization")


def test_layer_norm_over_two_dims():
    x, w, b = rand(3, 5, 7) + 3, rand(5, 7), rand(5, 7)
    attrs = {"normalized_shape": [5, 7], "eps": 1e-5, "stats": False}
    got = run_wgsl("layer_norm", [x, w, b], attrs, consts={1, 2})[0]
    check(got, F.layer_norm(x, [5, 7], w, b, 1e-5), "normalization")


def test_native_layer_norm_returns_mean_and_rstd():
    x = rand(7, 29)
    attrs = {"normalized_shape": [29], "eps": 1e-5, "stats": True}
    got = run_wgsl("layer_norm", [x, None, None], attrs)
    for g, w in zip(got, torch.native_layer_norm(x, [29], None, None, 1e-5)):
        check(g, w, "normalization")


# ---- embedding ------------------------------------------------------------------------------
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_embedding(index_dtype):
    w = rand(61, 13)
    idx = torch.randint(0, 61, (3, 7), dtype=index_dtype)
    check(run_wgsl("embedding", [w, idx], {}, consts={0})[0], F.embedding(idx, w), "embedding")


# Bags of embedding_bag (indices, offsets): of 3, 0, 1, 4 and 0 entries; the padding row 5 is
# in two of them.
BAGS = (torch.tensor([1, 5, 9, 4, 3, 5, 2, 0]), torch.tensor([0, 3, 3, 4, 8]))


def embedding_bag_reference(w, idx, offsets, mode, padding):
    return F.embedding_bag(idx.long(), w.double(), offsets.long(), mode=mode,
                           padding_idx=padding)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding", [None, 5])
def test_embedding_bag(mode, padding):
    w, (idx, offsets) = rand(11, 7), BAGS
    attrs = {"mode": mode, "padding_idx": -1 if padding is None else padding}
    got = run_wgsl("embedding_bag", [w, idx.int(), offsets], attrs, consts={0})[0]
    check(got, embedding_bag_reference(w, idx, offsets, mode, padding), "reduction")


# ---- attention ------------------------------------------------------------------------------
def sdpa_attrs(causal=False, scale=None, gqa=False):
    return {"is_causal": causal, "scale": scale, "enable_gqa": gqa}


def test_sdpa_plain_with_keys_over_several_chunks():
    q, k, v = rand(2, 3, 5, 29), rand(2, 3, 131, 29), rand(2, 3, 131, 11)
    got = run_wgsl("sdpa", [q, k, v, None], sdpa_attrs())[0]
    check(got, F.scaled_dot_product_attention(q, k, v), "attention")


@pytest.mark.parametrize("l, s", [(7, 7), (5, 11), (11, 5)])
def test_sdpa_causal_is_top_left(l, s):
    q, k, v = rand(1, 2, l, 16), rand(1, 2, s, 16), rand(1, 2, s, 16)
    got = run_wgsl("sdpa", [q, k, v, None], sdpa_attrs(causal=True, scale=0.3))[0]
    check(got, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3), "attention")


def test_sdpa_bool_mask():
    q, k, v = rand(1, 3, 5, 8), rand(1, 3, 7, 8), rand(1, 3, 7, 8)
    mask = torch.rand(5, 7) > 0.4
    mask[:, 0] = True
    got = run_wgsl("sdpa", [q, k, v, mask], sdpa_attrs())[0]
    check(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), "attention")


def test_sdpa_float_mask_broadcast_over_heads():
    q, k, v = rand(2, 3, 5, 8), rand(2, 3, 7, 8), rand(2, 3, 7, 5)
    mask = rand(2, 1, 5, 7)
    got = run_wgsl("sdpa", [q, k, v, mask], sdpa_attrs())[0]
    check(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), "attention")


def test_sdpa_grouped_query_heads():
    q, k, v = rand(1, 6, 3, 16), rand(1, 2, 13, 16), rand(1, 2, 13, 16)
    got = run_wgsl("sdpa", [q, k, v, None], sdpa_attrs(gqa=True))[0]
    check(got, F.scaled_dot_product_attention(q, k, v, enable_gqa=True), "attention")


def test_every_core_op_has_a_wgsl_kernel():
    core = {"add", "sub", "mul", "div", "neg", "exp", "sigmoid", "relu", "tanh", "rsqrt",
            "silu", "gelu", "pow", "abs", "sqrt", "log", "ceil", "floor", "clamp", "leaky_relu",
            "elu", "hardswish", "hardsigmoid", "sin", "cos", "linear", "mm", "bmm", "addmm", "softmax", "rms_norm",
            "layer_norm", "view", "expand", "permute", "slice", "select", "cat", "split",
            "unsqueeze", "squeeze", "clone", "embedding", "sdpa", "log1p", "eq", "ne", "lt",
            "le", "gt", "ge", "where", "cast", "copy"}
    assert {op for op in core if not kernels_wgsl.has_kernel(op)} == set()


def test_matmuls_with_one_row_take_the_gemv_route():
    a, b, bias = rand(3, 1, 37), rand(3, 37, 13), rand(13)
    check(run_wgsl("bmm", [a, b], {})[0], a @ b, "matmul")
    got = run_wgsl("addmm", [bias, a[0], b[0]], {"alpha": 2.0, "beta": 0.5})[0]
    check(got, torch.addmm(bias, a[0], b[0], alpha=2.0, beta=0.5), "matmul")

"""The op registry as a specification: every op has a CPU kernel, targets have one owner, and
for real edge graphs of each family every node we claim passes `check`, lowers to exactly one
IR node, and `infer` on that node reproduces the shapes torch.export recorded.

Graphs come from torch.export + to_edge_transform_and_lower without a partitioner; the ops our
partitioner keeps from decomposition are kept here through EdgeCompileConfig.preserve_ops, and
each family is also lowered fully decomposed, so both edge forms are covered.
"""
from __future__ import annotations

import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from torch.export import Dim

from delegate import symexpr
from delegate.errors import DelegateError
from delegate.ir import Graph
from delegate.lowering import LoweringContext, sym_text
from delegate.ops import all_ops
from delegate.ops.export import op_for_target, target_name
from kernels_cpu import has_kernel


def _core_ops():
    """Ops that run a kernel: folded ones (size queries, sym_*) are absorbed at lowering."""
    return {n: op for n, op in all_ops().items() if not (n.startswith("sym_") or op.folded)}


def test_every_op_has_a_cpu_kernel_of_the_same_name():
    missing = [n for n in _core_ops() if not has_kernel(n)]
    assert missing == []


def test_every_target_has_one_owner():
    owners = {}
    for name, op in all_ops().items():
        for t in op.targets:
            assert t not in owners, f"{t} claimed by {owners[t]} and {name}"
            owners[t] = name
    assert all(op_for_target(t).name == n for t, n in owners.items())


def test_kept_ops_are_among_the_targets():
    for op in all_ops().values():
        assert set(op.keep) <= set(op.targets), op.name


def _overload(name: str):
    ns, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


KEEP = sorted({k for op in all_ops().values() for k in op.keep})


# ---- one tiny module per family ---------------------------------------------------------------
class Elementwise(nn.Module):
    def forward(self, x, y):
        a = torch.add(x, y, alpha=2) + (x - 2.5) + x * 0.5 + x / y + x / 4.0
        b = torch.sub(x, y, alpha=0.5) - torch.neg(x) + torch.exp(x) + torch.sigmoid(x)
        c = F.silu(x) + F.relu(x) + F.gelu(x) + F.gelu(x, approximate="tanh") + torch.tanh(x)
        d = torch.abs(x) + torch.sqrt(y) + torch.log(y) + torch.ceil(x) + torch.floor(x) + \
            torch.log1p(y)
        e = x.clamp(-1, 1) + x.clamp(min=0) + F.hardtanh(x) + F.leaky_relu(x, 0.2) + F.elu(x)
        f = F.hardswish(x) + F.hardsigmoid(x) + torch.sin(x) + torch.cos(x)
        return a + b + c + d + e + f + torch.rsqrt(y) + x ** 2 + torch.pow(y, 0.5)


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(13, 7)
        self.proj = nn.Linear(7, 5, bias=False)
        self.conv = nn.Conv1d(3, 4, 2)

    def forward(self, x, a, b, c):
        bias = torch.ones(11)
        return (self.proj(self.fc(x)), a @ b, torch.bmm(c, c.transpose(1, 2)),
                torch.addmm(bias, a, b, beta=0.5, alpha=2.0), self.conv(c))


class Normalization(nn.Module):
    def __init__(self):
        super().__init__()
        self.rms = nn.RMSNorm(29)
        self.rms_eps = nn.RMSNorm([7, 29], eps=1e-6)
        self.ln = nn.LayerNorm(29)

    def forward(self, x):
        return self.rms(x), self.rms_eps(x), self.ln(x), F.layer_norm(x, (29,))


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1), F.softmax(x, dim=1)


class Shape(nn.Module):
    def forward(self, x, y):
        B, T, C = x.shape
        heads = x.view(B, T, 2, C // 2).transpose(1, 2).contiguous()
        q, k, v = torch.cat([x, y, x], dim=-1).split(C, dim=-1)
        return (heads, x.reshape(-1, C), x.permute(2, 0, 1), x[:, 1:, ::2], x[:, -1],
                x[..., 1:-1], x[:, :, :1].expand(-1, -1, 5), x.unsqueeze(1).squeeze(1),
                x.unsqueeze(0).squeeze(), x[0].t(), q + k + v, x.clone(),
                torch.slice_scatter(x, y[:, :2], dim=1, start=3, end=5), x.to(torch.int32),
                torch.ops.aten.copy(x, y[0, :1]))


class Comparison(nn.Module):
    def forward(self, x, y, i):
        return (x == y, x != 0.5, x < y, x <= 0, x > 20, x >= y, i[0] == 0, i < y,
                torch.where(x > y, x, y))


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(97, 13)
        self.bag = nn.EmbeddingBag(97, 13, mode="max")

    def forward(self, idx64, idx32):
        return self.emb(idx64) + self.emb(idx32), self.bag(idx64.reshape(-1), idx64[:, 0])


class Attention(nn.Module):
    def forward(self, q, k, v, kg, vg, bool_mask, float_mask):
        return (F.scaled_dot_product_attention(q, k, v, is_causal=True),
                F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask, scale=0.3),
                F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask),
                F.scaled_dot_product_attention(q, kg, vg, is_causal=True, enable_gqa=True))


class Block(nn.Module):
    """A pre-norm transformer block, exported with a dynamic sequence length."""

    def __init__(self, d=16, h=2):
        super().__init__()
        self.h = h
        self.n1, self.n2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, 4 * d, bias=False), nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2)
                   for t in self.qkv(self.n1(x)).split(D, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Reduction(nn.Module):
    def forward(self, x):
        return (x.sum(1), x.mean((0, -1), keepdim=True), x.amax(-1), x.amin((0, 2)),
                x.var(1, correction=0), x.mean(), x.sum(), x.argmax(1), x.argmin(),
                torch.median(x), torch.median(x, -1, keepdim=True))


class Pooling(nn.Module):
    def forward(self, x):
        return (F.max_pool2d(x, 3, 2, 1, ceil_mode=True), F.avg_pool2d(x, 3, 2, 1),
                F.adaptive_avg_pool2d(x, (2, 3)), F.interpolate(x, scale_factor=2.0),
                F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=True))


def _t(*shape):
    return torch.randn(shape)


FAMILIES = {
    "elementwise": (Elementwise, lambda: (_t(3, 5), torch.rand(5) + 0.5)),
    "linear": (Linear, lambda: (_t(2, 3, 13), _t(7, 13), _t(13, 11), _t(2, 3, 5))),
    "normalization": (Normalization, lambda: (_t(3, 7, 29),)),
    "softmax": (Softmax, lambda: (_t(3, 7, 29),)),
    "shape": (Shape, lambda: (_t(2, 7, 4), _t(2, 7, 4))),
    "comparison": (Comparison, lambda: (_t(3, 5), _t(5), torch.randint(0, 3, (3, 5)))),
    "embedding": (Embedding, lambda: (torch.randint(0, 97, (3, 5)),
                                      torch.randint(0, 97, (3, 5), dtype=torch.int32))),
    "attention": (Attention, lambda: (_t(1, 4, 5, 8), _t(1, 4, 7, 8), _t(1, 4, 7, 6),
                                      _t(1, 2, 7, 8), _t(1, 2, 7, 6),
                                      torch.rand(5, 7) > 0.3, _t(1, 1, 5, 7))),
    "reduction": (Reduction, lambda: (_t(3, 5, 7),)),
    "pooling": (Pooling, lambda: (_t(2, 3, 11, 13),)),
}
# Targets the kept graphs may hold that no family here claims: sizes (delegate/ops/symbolic.py)
# and the constant bias factory of Linear's addmm.
FOREIGN = {"aten.sym_size.int", "aten.full.default"}


def _edge_graph(module, args, keep: bool, dynamic_shapes=None):
    ep = torch.export.export(module.eval(), args, dynamic_shapes=dynamic_shapes)
    # median is no core ATen op (torch has no decomposition of it); we claim it as it is
    config = EdgeCompileConfig(preserve_ops=[_overload(k) for k in KEEP] if keep else [],
                               _core_aten_ops_exception_list=[torch.ops.aten.median.default,
                                                              torch.ops.aten.median.dim])
    edge = to_edge_transform_and_lower(ep, compile_config=config)
    return edge.exported_program()


def _lower_and_infer(ep, strict: bool = True) -> tuple:
    """Lower every node we claim, asserting the contract.

    Returns (target, op name) per claimed node and the set of targets nobody here claims.
    strict: every claimed node must pass check; otherwise one that fails counts as foreign
    (decomposed graphs hold int64 index arithmetic that is rightly left to ExecuTorch)."""
    bounds = {str(s): int(r.upper) for s, r in ep.range_constraints.items()}
    ctx = LoweringContext(Graph(), bounds)
    env = {}
    seen, foreign = [], set()
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            ctx.bind_input(node)
            env.update(_hints(node.meta["val"]))
            continue
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        op = op_for_target(node.target)
        name = target_name(node.target)
        if op is None:
            foreign.add(name)
            if isinstance(node.meta.get("val"), torch.Tensor):
                ctx.output(node)
            continue
        if op.folded:
            op.lower(ctx, node)
            continue
        reason = op.check(node) if op.check else None
        if reason is not None and not strict:
            foreign.add(name)
            ctx.output(node)
            continue
        assert reason is None, (name, reason)
        before = len(ctx.graph.nodes)
        op.lower(ctx, node)
        assert len(ctx.graph.nodes) == before + 1, f"{name}: expected one IR node"
        ir = ctx.graph.nodes[-1]
        assert ir.op == op.name
        in_shapes = [None if v == -1 else symexpr.resolve(tuple(ctx.graph.tensor(v).dims), env)
                     for v in ir.inputs]
        got = [tuple(s) for s in op.infer(in_shapes, symexpr.resolve(ir.attrs, env))]
        vals = node.meta["val"] if isinstance(node.meta["val"], (tuple, list)) else [node.meta["val"]]
        want = [tuple(symexpr.resolve(sym_text(s), env) for s in v.shape) for v in vals]
        want = want[:len(ir.outputs)]   # a tuple-valued node read only at 0 (only_output0)
        assert got == want, f"{name}: infer gave {got}, export recorded {want}"
        seen.append((name, op.name))
    return seen, foreign


def _hints(val) -> dict:
    """Symbol -> example value for the dims of a placeholder (the live sizes at export)."""
    if not isinstance(val, torch.Tensor):
        return {}
    out = {}
    for s in val.shape:
        if isinstance(s, torch.SymInt) and not s.node.expr.is_number:
            env = s.node.shape_env
            hints = getattr(env, "backed_var_to_val", None) or env.var_to_val
            for sym, v in hints.items():
                out[str(sym)] = int(v)
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_lowers_and_infers_export_shapes(family):
    module, make_args = FAMILIES[family]
    seen, foreign = _lower_and_infer(_edge_graph(module(), make_args(), keep=True))
    assert foreign <= FOREIGN
    # ops with no edge target (an in-place twin the lowering emits) cannot appear in a graph
    own = {n for n, op in all_ops().items()
           if op.lower.__module__ == f"delegate.ops.{family}" and op.targets}
    assert own <= {op_name for _, op_name in seen}, "every op of the family appears"


# Decomposed, linear becomes permute_copy + addmm / mm, layer_norm native_layer_norm, silu
# sigmoid * x: the forms a graph takes where the partitioner did not keep an op.
@pytest.mark.parametrize("family", ["elementwise", "linear", "normalization"])
def test_decomposed_family_lowers_and_infers_export_shapes(family):
    module, make_args = FAMILIES[family]
    seen, _ = _lower_and_infer(_edge_graph(module(), make_args(), keep=False), strict=False)
    assert seen


def test_transformer_block_with_dynamic_length_lowers_and_infers():
    T = Dim("T", min=1, max=128)
    ep = _edge_graph(Block(), (_t(1, 7, 16),), keep=True, dynamic_shapes=({1: T},))
    seen, foreign = _lower_and_infer(ep)
    seen = {n for _, n in seen}
    assert foreign <= FOREIGN
    assert {"rms_norm", "linear", "split", "view", "permute", "sdpa", "add", "silu",
            "mul"} <= seen


# ---- infer on arbitrary shapes -----------------------------------------------------------------
INT_MAX = 2 ** 63 - 1
SAMPLE_ATTRS = {
    "add": {"other": None, "alpha": 1.0}, "sub": {"other": None, "alpha": 1.0},
    "mul": {"other": None}, "div": {"other": None}, "gelu": {"approximate": "none"},
    "pow": {"exponent": 2}, "addmm": {"beta": 1.0, "alpha": 1.0},
    "rms_norm": {"normalized_shape": [5], "eps": None},
    "layer_norm": {"normalized_shape": [5], "eps": 1e-5, "stats": True},
    "softmax": {"dim": -1}, "view": {"sizes": [-1, 5]}, "expand": {"sizes": [3, -1, 5]},
    "permute": {"dims": [1, 0, 2]}, "slice": {"dim": 1, "start": 1, "end": INT_MAX, "step": 2},
    "select": {"dim": 1, "index": -1}, "cat": {"dim": 1}, "unsqueeze": {"dim": -1},
    "cast": {"dtype": "bool"},
    "slice_scatter": {"dim": 1, "start": 2, "src_dims": []},
    "slice_scatter_": {"dim": 1, "start": 2, "src_dims": []},
    "slice_scatter_pair": {"dim": 1, "start": 2, "src_dims": [], "src_dims1": []},
    "embedding_q4gsw": {"group_size": 32, "D": 64, "V": 5},
    "squeeze": {"dims": [0, 2]}, "split": {"split_sizes": [2, 3], "dim": -1},
    "sdpa": {"is_causal": True, "scale": None, "enable_gqa": True},
    "convolution": {"stride": [2, 1], "padding": [1, 0], "dilation": [1, 2], "transposed": False,
                    "output_padding": [0, 0], "groups": 1},
    "batch_norm": {"eps": 1e-5},
    "embedding_bag": {"mode": "mean", "padding_idx": -1},
}
OUR_FAMILIES = ("elementwise", "linear", "normalization", "softmax", "shape", "embedding",
                "attention", "batch_norm", "comparison")


def _random_shapes(gen: torch.Generator, count: int) -> list:
    shapes = []
    for _ in range(count):
        rank = int(torch.randint(0, 5, (1,), generator=gen))
        shapes.append(tuple(int(s) for s in torch.randint(0, 6, (rank,), generator=gen)))
    return shapes


@pytest.mark.parametrize("name", sorted(n for n, op in all_ops().items()
                                        if op.lower.__module__.split(".")[-1] in OUR_FAMILIES))
def test_infer_raises_only_delegate_errors_on_arbitrary_shapes(name):
    op, gen = all_ops()[name], torch.Generator().manual_seed(0)
    for trial in range(300):
        shapes = _random_shapes(gen, 1 + trial % 4)
        try:
            out = op.infer(shapes, dict(SAMPLE_ATTRS.get(name, {})))
        except DelegateError as e:
            assert "expected" in str(e), str(e)
            continue
        assert all(isinstance(s, tuple) and all(isinstance(d, int) and d >= 0 for d in s)
                   for s in out), (shapes, out)


def test_check_rejects_channels_last_and_integer_inputs():
    class M(nn.Module):
        def forward(self, x, i):
            return torch.relu(x), torch.abs(i)   # abs is float32 only (add runs integers)

    x = torch.randn(1, 3, 5, 7).to(memory_format=torch.channels_last)
    ep = torch.export.export(M(), (x, torch.arange(5)))
    graph = to_edge_transform_and_lower(ep).exported_program().graph
    reasons = {target_name(n.target): op_for_target(n.target).check(n)
               for n in graph.nodes if n.op == "call_function"}
    assert "dim order" in reasons["aten.relu.default"]
    assert "float32" in reasons["aten.abs.default"]


@pytest.mark.parametrize("fn,needle", [
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1), "dropout_p"),
    (lambda x, y: torch.div(x, y, rounding_mode="floor"), "rounding_mode"),
], ids=["sdpa-dropout", "div-floor"])
def test_check_rejects_unsupported_arguments(fn, needle):
    class M(nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    n_args = fn.__code__.co_argcount
    xs = tuple(torch.randn(1, 2, 5, 7) for _ in range(n_args))
    ep = torch.export.export(M(), xs)
    keep = EdgeCompileConfig(preserve_ops=[_overload(k) for k in KEEP])
    graph = to_edge_transform_and_lower(ep, compile_config=keep).exported_program().graph
    reasons = [op_for_target(n.target).check(n) for n in graph.nodes
               if n.op == "call_function" and op_for_target(n.target)]
    assert any(r and needle in r for r in reasons), reasons


def test_kept_ops_pass_check_on_the_aten_graph():
    # The partitioner asks `check` of kept ops before decomposition, where the transposed q, k,
    # v feeding SDPA are still strided views: a check that wants contiguous inputs there would
    # silently decompose every attention.
    ep = torch.export.export(Block().eval(), (_t(1, 7, 16),)).run_decompositions({})
    kept = {k for k in KEEP}
    nodes = [n for n in ep.graph.nodes
             if n.op == "call_function" and target_name(n.target) in kept]
    assert {target_name(n.target) for n in nodes} >= {
        "aten.linear.default", "aten.rms_norm.default", "aten.scaled_dot_product_attention.default",
        "aten.silu.default"}
    assert {target_name(n.target): op_for_target(n.target).check(n) for n in nodes
            if op_for_target(n.target).check(n) is not None} == {}

"""The rope_cache pass (delegate/passes/rope_cache.py) and its op (delegate/ops/rope.py): a
layer's rope_pair and its KV cache slice_scatter_pair become one rope_cache, one dispatch,
with k rotated straight into its cache rows. Bit for bit the two nodes it replaces; where it
may not fire, the graph lowers byte-identically to the lowering with the pass off.

References: the kernel against float64 (the rope pass test's per-channel rotation and torch
slice assignment) and, bit for bit, against the rope kernel it stands for; programs against
the same model lowered without the pass (NO_ROPE_CACHE) and eager float32 (the model
tolerance).
"""
import pytest
import torch

from delegate import blob, passes
from delegate.aot import undelegated_ops
from delegate.errors import DelegateError
from delegate.ir import Graph, Node, SymbolBinding, SymExpr, TensorValue
from delegate.ops import get_op
from tests.test_batch_norm import _blobs, _ops
from tests.test_graph_plan import EXECUTORS, executor
from tests.test_kernels_cpu import run
from tests.test_kernels_wgsl import run_wgsl
from tests.test_llm_et import _built, _logits, _steps, llama_program, run_steps
from tests.test_pass_cache_write import LAYERS
from tests.test_pass_rope import _reference
from tests.tolerances import tol

NO_ROPE_CACHE = ",".join(n for n in passes.PASSES if n != "rope_cache")
S, HQ, HK, DK, DV = 37, 5, 3, 10, 7   # cache rows, q and kv heads, k and v head dims
WRITES = {1: (0, 17, 36), 7: (0, 13, 30)}   # rows -> starts, the last rows among them
# layout -> (source shape [1, ., ., D] for t rows and h heads, src_dims into [1, H, S, D],
#            the tables' leading dims, the tables' last dim per rotary_dim)
LAYOUTS = {
    "et": (lambda t, h, d: (1, t, h, d), [0, 2, 1, 3], lambda t: (1, t, 1), lambda r: r // 2),
    "hf": (lambda t, h, d: (1, h, t, d), [], lambda t: (t,), lambda r: r),
}


# ---- the kernel ---------------------------------------------------------------------------------
def _graph(layout: str, rows: int, rotated: int, attrs: dict) -> Graph:
    """caches made by neg (node outputs, so the node may write them); out, q' =
    rope_cache(cache, src, cache1, src1, q, cos, sin) at dim 2, row `pos`; out1 reads cache1
    back after. Source `rotated` is k (DK), the other v (DV)."""
    shape, _, lead, width = LAYOUTS[layout]
    g = Graph()

    def value(dims, dtype=torch.float32):
        return g.add_value(TensorValue(dtype, dims, dims))

    dims = [DK, DV] if rotated == 0 else [DV, DK]
    a, b = (value((1, HK, S, d)) for d in dims)
    src, src1 = (value(shape(rows, HK, d)) for d in dims)
    q = value(shape(rows, HQ, DK))
    cos, sin = (value(lead(rows) + (width(attrs["rotary_dim"]),)) for _ in range(2))
    pos = value((1,), torch.int64)
    cache, cache1 = value((1, HK, S, dims[0])), value((1, HK, S, dims[1]))
    out, q_out, out1 = value((1, HK, S, dims[0])), value(shape(rows, HQ, DK)), \
        value((1, HK, S, dims[1]))
    g.inputs, g.outputs = [a, b, src, src1, q, cos, sin, pos], [out, q_out, out1]
    g.symbols = [SymbolBinding("u0", 7, -1)]
    g.nodes = [Node("neg", [a], [cache], {}), Node("neg", [b], [cache1], {}),
               Node("rope_cache", [cache, src, cache1, src1, q, cos, sin], [out, q_out],
                    {**attrs, "dim": 2, "start": SymExpr("u0"), "rotated": rotated}),
               Node("neg", [cache1], [out1], {})]
    return g


def _feeds(g: Graph, pos: int) -> list:
    torch.manual_seed(pos)
    *tensors, cos, sin, _ = [g.values[v].dims for v in g.inputs]
    angles = torch.randn(cos, dtype=torch.float64) * 3
    return [torch.randn(s, dtype=torch.float64) for s in tensors] + \
        [angles.cos(), angles.sin(), torch.tensor([pos])]


def _in_cache(src, perm):
    """src as the cache's [1, H, rows, D] rows."""
    return src.permute(*perm) if perm else src


@pytest.mark.parametrize("rotated", [0, 1], ids=["k-later", "k-earlier"])
@pytest.mark.parametrize("style, rotary_dim", [("interleaved", DK), ("half", 6)],
                         ids=["interleaved", "half-partial6"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("rows", sorted(WRITES))
@pytest.mark.parametrize("kind", EXECUTORS)
def test_rope_cache_rotates_k_into_its_rows_and_copies_v_as_its_rope_and_writes(
        kind, rows, layout, style, rotary_dim, rotated):
    perm = LAYOUTS[layout][1]
    attrs = {"style": style, "rotary_dim": rotary_dim, "src_dims": perm, "src_dims1": perm}
    g = blob.decode(blob.encode(_graph(layout, rows, rotated, attrs)))   # the decoder accepts it
    ex = executor(kind, g)
    rope = {"style": style, "rotary_dim": rotary_dim}
    try:
        for pos in WRITES[rows]:
            a, b, src, src1, q, cos, sin, at = _feeds(g, pos)
            out, q_out, out1 = ex.execute([t.float() if t.is_floating_point() else t
                                           for t in (a, b, src, src1, q, cos, sin, at)])
            caches = [-a.float().double(), -b.float().double()]
            got = [out.double(), -out1.double()]
            sources = [src, src1]
            k = sources[rotated]
            # k's rows: its float64 rotation, and bit for bit the rope kernel's output
            alone, = (run("rope", [k.float(), cos.float(), sin.float()], **rope) if kind == "cpu"
                      else run_wgsl("rope", [k, cos, sin], rope))
            for j, (cache, g_j) in enumerate(zip(caches, got)):
                window = g_j[:, :, pos:pos + rows]
                if j == rotated:
                    want = _in_cache(_reference(k, cos, sin, style, rotary_dim), perm)
                    torch.testing.assert_close(window, want, **tol("elementwise", kind))
                    assert torch.equal(window.float(), _in_cache(alone, perm))
                else:   # v: its bits, moved
                    assert torch.equal(window, _in_cache(sources[j].float().double(), perm))
                outside = torch.cat([g_j[:, :, :pos], g_j[:, :, pos + rows:]], 2)
                assert torch.equal(outside, torch.cat([cache[:, :, :pos],
                                                       cache[:, :, pos + rows:]], 2))
            torch.testing.assert_close(q_out.double(), _reference(q, cos, sin, style, rotary_dim),
                                       **tol("elementwise", kind))
    finally:
        ex.destroy()


def test_rope_cache_infer_checks_the_rotation_and_both_writes():
    op, rope = get_op("rope_cache"), {"style": "interleaved", "rotary_dim": DK}
    attrs = {**rope, "dim": 2, "start": 3, "src_dims": [0, 2, 1, 3], "src_dims1": [0, 2, 1, 3],
             "rotated": 1}
    v, k, q = (1, 4, HK, DV), (1, 4, HK, DK), (1, 4, HQ, DK)
    cache, cache1, table = (1, HK, S, DV), (1, HK, S, DK), (1, 4, 1, DK // 2)
    assert op.infer([cache, v, cache1, k, q, table, table], attrs) == [cache, q]
    with pytest.raises(DelegateError, match="rotary_dim"):   # v (DV < 10) is not what rotates
        op.infer([cache, v, cache1, k, q, table, table], {**attrs, "rotated": 0})
    with pytest.raises(DelegateError, match="rows"):   # past the cache's end
        op.infer([cache, v, cache1, k, q, table, table], {**attrs, "start": S - 3})
    with pytest.raises(DelegateError, match="rotated"):
        op.infer([cache, v, cache1, k, q, table, table], {**attrs, "rotated": 2})


# ---- where it fires: ExecuTorch's Llama ----------------------------------------------------------
@pytest.mark.parametrize("form", ["plain", "custom"])   # index_put, llama.update_cache
@pytest.mark.parametrize("quantize", [False, True], ids=["fp32", "int4-g32"])
@pytest.mark.parametrize("device", EXECUTORS)
def test_tiny_llama_rotates_and_writes_each_layers_cache_in_one_node_bit_for_bit(device,
                                                                                quantize, form):
    fused = llama_program(device, quantize, form)
    unfused = llama_program(device, quantize, form, NO_ROPE_CACHE)
    assert undelegated_ops(fused) == []
    steps = _steps(7, decode=3)   # a prefill, then decode steps (T = 1) on the same caches
    got, described, _ = run_steps(fused, device, steps)
    base, base_described, _ = run_steps(unfused, device, steps)
    assert described["ops"].count("rope_cache") == LAYERS
    assert not {"rope_pair", "slice_scatter_pair"} & set(described["ops"])
    assert base_described["ops"].count("rope_pair") == LAYERS
    assert base_described["ops"].count("slice_scatter_pair") == LAYERS
    if device == "webgpu":   # the pair's copy joins the rope's dispatch
        assert base_described["dispatches"] - described["dispatches"] == LAYERS
    eager, pos = _built(quantize, form), 0
    for tokens, g, b in zip(steps, got, base):
        assert torch.equal(g, b)
        want = _logits(eager(tokens, {"input_pos": torch.tensor([pos])}))
        torch.testing.assert_close(g, want, **tol("model", device))
        pos += tokens.shape[1]


# ---- where it must not fire ---------------------------------------------------------------------
class RotatedCaches(torch.nn.Module):
    """ExecuTorch's layer in small: q and k (x's channels 0..3 and 1..4, one head) rotated by
    apply_rotary_emb, k and v (x) written into their caches at the position; `k_read` also
    returns k' itself, `late_v` computes v after the rotation."""

    def __init__(self, k_read: bool = False, late_v: bool = False):
        super().__init__()
        self.k_read, self.late_v = k_read, late_v
        self.register_buffer("k_cache", torch.zeros(1, 11, 1, 4))
        self.register_buffer("v_cache", torch.zeros(1, 11, 1, 5))

    def forward(self, x, input_pos, cos, sin):
        from executorch.examples.models.llama.rope import apply_rotary_emb

        pos = input_pos[-1].item()
        torch._check(pos >= 0)
        torch._check(pos + x.shape[1] <= 11)
        rows = torch.arange(x.shape[1]) + pos
        v = None if self.late_v else x[:, :, None] * 3
        q, k = apply_rotary_emb(x[:, :, None, :4], x[:, :, None, 1:], cos, sin)
        if v is None:
            v = x[:, :, None] * 3
        self.k_cache.index_copy_(1, rows, k)   # as ExecuTorch's KVCache.update
        self.v_cache.index_copy_(1, rows, v)
        extra = (k * 1.0,) if self.k_read else ()
        return (q * 2, self.k_cache * 2, self.v_cache * 2) + extra


class RotatedInputCaches(torch.nn.Module):
    """RotatedCaches' layer writing into caches the caller passes in: not the delegate's
    states, so neither the pair nor rope_cache may write them in place."""

    def forward(self, k_cache, v_cache, x, input_pos, cos, sin):
        from executorch.examples.models.llama.rope import apply_rotary_emb

        pos = input_pos[0].item()
        torch._check(pos >= 0)
        torch._check(pos + x.shape[1] <= 11)
        rows = torch.arange(x.shape[1]) + pos
        v = x[:, :, None] * 3
        q, k = apply_rotary_emb(x[:, :, None, :4], x[:, :, None, 1:], cos, sin)
        return (q * 2, torch.ops.aten.index_copy.default(k_cache, 1, rows, k),
                torch.ops.aten.index_copy.default(v_cache, 1, rows, v))


def test_a_rotated_k_into_caller_caches_lowers_as_with_the_pass_off():
    from tests.test_pass_swiglu import _lower

    t = torch.export.Dim("T", min=1, max=7)
    angles = torch.randn(3, 2)
    inputs = [torch.zeros(1, 11, 1, 4), torch.zeros(1, 11, 1, 5), torch.randn(1, 3, 5),
              torch.tensor([0]), angles.cos(), angles.sin()]
    on, off = (_lower(RotatedInputCaches(), inputs, "webgpu", passes=p,
                      dynamic_shapes=(None, None, {1: t}, None, {0: t}, {0: t}))
               for p in (None, NO_ROPE_CACHE))
    assert "rope_pair" in _ops(on) and "rope_cache" not in _ops(on)
    assert _blobs(on) == _blobs(off)


def _rotated_pm(model, passes=None):
    from tests.test_pass_swiglu import _lower

    t = torch.export.Dim("T", min=1, max=7)
    angles = torch.randn(3, 2)
    return _lower(model, [torch.randn(1, 3, 5), torch.tensor([0]), angles.cos(), angles.sin()],
                  "webgpu", passes=passes, dynamic_shapes=({1: t}, None, {0: t}, {0: t}))


@pytest.mark.parametrize("name", ["k-read-elsewhere", "v-after-the-rope"])
def test_a_rotated_k_that_may_not_skip_its_tensor_lowers_as_with_the_pass_off(name):
    model = RotatedCaches(k_read=name == "k-read-elsewhere", late_v=name == "v-after-the-rope")
    on, off = _rotated_pm(model), _rotated_pm(model, NO_ROPE_CACHE)
    assert "rope_pair" in _ops(on) and "rope_cache" not in _ops(on)
    assert _blobs(on) == _blobs(off)


def test_it_fires_on_the_same_graph_when_k_and_v_allow():
    ops = _ops(_rotated_pm(RotatedCaches()))
    assert "rope_cache" in ops and not {"rope_pair", "slice_scatter_pair"} & set(ops)


def test_it_runs_only_with_the_rope_and_cache_write_passes():
    for spec in ("rope_cache", "rope,rope_cache", "cache_write,rope_cache"):
        assert "rope_cache" not in _ops(_rotated_pm(RotatedCaches(), spec))
    assert "rope_cache" in _ops(_rotated_pm(RotatedCaches(), "rope,cache_write,rope_cache"))

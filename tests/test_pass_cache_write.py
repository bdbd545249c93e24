"""The cache_write pass (delegate/passes/cache_write.py): a layer's k and v cache writes run as
one slice_scatter_pair, one dispatch, bit for bit the two slice_scatter_ writes; where they
may not pair, or there is one write, the graph lowers byte-identically to the pass-off lowering.

References: torch slice assignment in float64 (int32 for integer caches) for the kernel, the
same model lowered without the pass (UNFUSED_SPEC) and eager float32 (the model tolerance).
"""
import pytest
import torch

from delegate import blob, passes
from delegate.aot import undelegated_ops
from delegate.ir import Graph, Node, SymbolBinding, SymExpr, TensorValue
from tests.test_batch_norm import _blobs, _ops
from tests.test_graph_plan import EXECUTORS, executor
from tests.test_llm_et import _built, _logits, _steps, llama_program, run_steps
from tests.test_models import run_pte
from tests.test_pass_swiglu import _lower
from tests.tolerances import tol

LAYERS = 2   # tests/test_llm_et.py's ARGS
UNFUSED_SPEC = ",".join(n for n in passes.PASSES if n != "cache_write")
CACHE, CACHE1 = (1, 3, 37, 5), (1, 3, 37, 7)   # K != V head dims
WRITES = {1: (0, 17, 36), 11: (0, 13, 26)}     # rows -> starts, the last rows among them


# ---- the kernel ---------------------------------------------------------------------------------
def _pair_graph(dtype, rows: int, transposed: bool) -> Graph:
    """dst, dst1 = made(a), made(b) (node outputs, so the pair may write them); out =
    slice_scatter_pair(dst, src, dst1, src1) at dim 2, row `pos`; out1 reads dst1 back after.
    made: neg (float32) or cast (int32); read: neg or cast to float32. Transposed sources are
    [1, rows, 3, D], read through src_dims [0, 2, 1, 3]."""
    g = Graph()

    def value(dt, shape):
        return g.add_value(TensorValue(dt, shape, shape))

    def source(cache):
        return value(dtype, (1, rows, 3, cache[3]) if transposed else cache[:2] + (rows, cache[3]))

    a, b = value(torch.float32, CACHE), value(torch.float32, CACHE1)
    src, src1 = source(CACHE), source(CACHE1)
    pos = value(torch.int64, (1,))
    dst, dst1, out = value(dtype, CACHE), value(dtype, CACHE1), value(dtype, CACHE)
    out1 = value(torch.float32, CACHE1)
    g.inputs, g.outputs = [a, b, src, src1, pos], [out, out1]
    g.symbols = [SymbolBinding("u0", 4, -1)]
    made = ("neg", {}) if dtype == torch.float32 else ("cast", {"dtype": "int32"})
    read = ("neg", {}) if dtype == torch.float32 else ("cast", {"dtype": "float32"})
    perm = [0, 2, 1, 3] if transposed else []
    g.nodes = [Node(made[0], [a], [dst], dict(made[1])), Node(made[0], [b], [dst1], dict(made[1])),
               Node("slice_scatter_pair", [dst, src, dst1, src1], [out],
                    {"dim": 2, "start": SymExpr("u0"), "src_dims": perm, "src_dims1": perm}),
               Node(read[0], [dst1], [out1], dict(read[1]))]
    return g


def _written(cache, src, pos: int, transposed: bool):
    """cache with rows [pos, pos + n) of dim 2 replaced by src, by slice assignment."""
    want = cache.clone()
    rows = src.transpose(1, 2) if transposed else src
    want[:, :, pos:pos + rows.shape[2]] = rows
    return want


def _outside(t, pos: int, rows: int):
    """t's rows of dim 2 outside [pos, pos + rows)."""
    return torch.cat([t[:, :, :pos], t[:, :, pos + rows:]], 2)


@pytest.mark.parametrize("transposed", [False, True], ids=["plain", "src_dims"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=["float32", "int32"])
@pytest.mark.parametrize("rows", sorted(WRITES))
@pytest.mark.parametrize("kind", EXECUTORS)
def test_slice_scatter_pair_writes_both_caches_as_slice_assignment(kind, rows, dtype, transposed):
    g = blob.decode(blob.encode(_pair_graph(dtype, rows, transposed)))   # the decoder accepts it
    ex = executor(kind, g)
    ref = torch.float64 if dtype == torch.float32 else torch.int32
    sign = -1 if dtype == torch.float32 else 1   # made and read are neg, or casts
    try:
        for pos in WRITES[rows]:
            torch.manual_seed(pos)
            a, b = (torch.randn(s).mul(8).round() for s in (CACHE, CACHE1))
            src, src1 = (torch.randn(g.values[v].dims).mul(8).round().to(dtype)
                         for v in g.inputs[2:4])
            out, out1 = ex.execute([a, b, src, src1, torch.tensor([pos])])
            old, old1 = a.to(ref) * sign, b.to(ref) * sign
            got, got1 = out.to(ref), out1.to(ref) * sign
            assert torch.equal(got, _written(old, src.to(ref), pos, transposed))
            assert torch.equal(got1, _written(old1, src1.to(ref), pos, transposed))
            # outside their windows both caches are their old selves
            assert torch.equal(_outside(got, pos, rows), _outside(old, pos, rows))
            assert torch.equal(_outside(got1, pos, rows), _outside(old1, pos, rows))
    finally:
        ex.destroy()


# ---- where it fires: ExecuTorch's Llama ----------------------------------------------------------
def _llama(device, quantize, form, passes=None):
    """(program manager, eager twin with the same weights): test_llm_et's tiny Llama, lowered
    once a session per configuration."""
    return llama_program(device, quantize, form, passes), _built(quantize, form)


@pytest.mark.parametrize("form", ["plain", "custom"])   # index_put, llama.update_cache
@pytest.mark.parametrize("quantize", [False, True], ids=["fp32", "int4-g32"])
@pytest.mark.parametrize("device", EXECUTORS)
def test_tiny_llama_writes_each_layers_caches_in_one_dispatch_bit_for_bit_unfused(device,
                                                                                   quantize, form):
    fused, eager = _llama(device, quantize, form)
    unfused, _ = _llama(device, quantize, form, UNFUSED_SPEC)
    assert undelegated_ops(fused) == []
    steps = _steps(7, decode=3)   # a prefill, then decode steps (T = 1) on the same caches
    got, described, _ = run_steps(fused, device, steps)
    base, base_described, _ = run_steps(unfused, device, steps)
    # each layer's pair joins its rope_pair (the rope_cache pass, tests/test_pass_rope_cache.py)
    assert described["ops"].count("rope_cache") == LAYERS
    assert "slice_scatter_" not in described["ops"] and "rope_pair" not in described["ops"]
    assert base_described["ops"].count("slice_scatter_") == 2 * LAYERS
    if device == "webgpu":   # each slice_scatter_ was one strided_copy dispatch, rope_pair one
        assert base_described["dispatches"] - described["dispatches"] == 2 * LAYERS
    pos = 0
    for tokens, g, b in zip(steps, got, base):
        assert torch.equal(g, b)
        want = _logits(eager(tokens, {"input_pos": torch.tensor([pos])}))
        torch.testing.assert_close(g, want, **tol("model", device))
        pos += tokens.shape[1]


# ---- where it must not fire ---------------------------------------------------------------------
class Caches(torch.nn.Module):
    """k_cache[:, pos:pos + T] = k and v_cache[:, pos:pos + T] = v, as ExecuTorch writes its KV
    cache; `between` reads the new k cache before v is written (v = x + k_cache.sum())."""

    def __init__(self, n_caches: int = 2, between: bool = False, own_pos: bool = False):
        super().__init__()
        self.n, self.between, self.own_pos = n_caches, between, own_pos
        for i in range(n_caches):
            self.register_buffer(f"c{i}", torch.zeros(1, 11, 3 + 2 * i))

    def forward(self, x, input_pos):
        pos = input_pos[-1].item()
        torch._check(pos >= 0)
        torch._check(pos + x.shape[1] <= 11)
        rows = torch.arange(x.shape[1]) + pos
        self.c0[:, rows] = x[..., :3]
        if self.n == 1:
            return self.c0 * 2
        v = x + self.c0.sum() if self.between else x
        if self.own_pos:   # v's write reads the position itself: its own unbacked symbol
            pos1 = input_pos[-1].item()
            torch._check(pos1 >= 0)
            torch._check(pos1 + x.shape[1] <= 11)
            rows = torch.arange(x.shape[1]) + pos1
        self.c1[:, rows] = v
        return self.c0 * 2, self.c1 * 3


def _caches_pm(model, passes=None):
    t = torch.export.Dim("T", min=1, max=7)
    return _lower(model, [torch.randn(1, 3, 5), torch.tensor([0])], "webgpu", passes=passes,
                  dynamic_shapes=({1: t}, None))


def test_a_single_cache_write_lowers_byte_identically_to_the_pass_off_lowering():
    on, off = _caches_pm(Caches(1)), _caches_pm(Caches(1), UNFUSED_SPEC)
    assert _ops(on).count("slice_scatter_") == 1
    assert _blobs(on) == _blobs(off)


def test_writes_with_a_read_of_the_first_cache_between_them_stay_two():
    on, off = _caches_pm(Caches(between=True)), _caches_pm(Caches(between=True), UNFUSED_SPEC)
    assert _ops(on).count("slice_scatter_") == 2 and "slice_scatter_pair" not in _ops(on)
    assert _blobs(on) == _blobs(off)


@pytest.mark.parametrize("own_pos", [False, True], ids=["one_item", "item_per_write"])
@pytest.mark.parametrize("device", EXECUTORS)
def test_two_caches_pair_and_match_eager_across_executes(device, own_pos):
    # item_per_write: each write's start is its own `.item()` of the same position element
    # (distinct unbacked symbols, as older torch exports ExecuTorch's Llama); they still pair
    pm = _caches_pm(Caches(own_pos=own_pos))
    assert _ops(pm).count("slice_scatter_pair") == 1
    eager, feeds = Caches(own_pos=own_pos), [(torch.randn(1, t, 5), torch.tensor([p]))
                              for p, t in ((0, 3), (3, 1), (4, 7), (9, 2))]
    got = run_pte(pm, [list(f) for f in feeds], device)
    for (x, at), outs in zip(feeds, got):
        for g, w in zip(outs, eager(x, at)):
            assert torch.equal(g, w)


class InputCaches(torch.nn.Module):
    """Two writes at one position into caches the caller passes in: not the delegate's states,
    so the pair may not write one of them as an input."""

    def forward(self, k_cache, v_cache, x, input_pos):
        pos = input_pos[0].item()
        torch._check(pos >= 0)
        torch._check(pos + x.shape[1] <= 11)
        rows = torch.arange(x.shape[1]) + pos
        k = torch.ops.aten.index_put.default(k_cache, [None, rows], x[..., :3])
        return k, torch.ops.aten.index_put.default(v_cache, [None, rows], x)


def test_writes_into_caller_caches_stay_two_and_lower_byte_identically():
    t = torch.export.Dim("T", min=1, max=7)
    inputs = [torch.zeros(1, 11, 3), torch.zeros(1, 11, 5), torch.randn(1, 3, 5),
              torch.tensor([0])]
    on, off = (_lower(InputCaches(), inputs, "webgpu", passes=p,
                      dynamic_shapes=(None, None, {1: t}, None)) for p in (None, UNFUSED_SPEC))
    assert "slice_scatter_pair" not in _ops(on) and _ops(on).count("slice_scatter") == 2
    assert _blobs(on) == _blobs(off)


# ---- v written and repeated before k (the order torch 2.11 exports ExecuTorch's Llama in) ------
class RepeatedCaches(torch.nn.Module):
    """One attention over caches [1, 2, 11, D] (2 KV heads, 4 query heads): v is written, and
    its heads repeated as ExecuTorch's attention repeats them (repeat_interleave), before k is
    even computed; then k is written and repeated, and the sdpa reads both repeats. With
    `v_read`, the repeated v is also returned, so the repeat is a real copy of the cache taken
    before k's write."""

    def __init__(self, v_read: bool = False):
        super().__init__()
        self.v_read = v_read
        self.register_buffer("k_cache", torch.zeros(1, 2, 11, 4))
        self.register_buffer("v_cache", torch.zeros(1, 2, 11, 3))

    def forward(self, x, input_pos):
        pos = input_pos[-1].item()
        torch._check(pos >= 0)
        torch._check(pos + x.shape[1] <= 11)
        rows = torch.arange(x.shape[1]) + pos
        heads = x.view(1, x.shape[1], 2, 6).transpose(1, 2)   # [1, 2, T, 6]
        self.v_cache[:, :, rows] = heads[..., :3] * 3
        v = self.v_cache.repeat_interleave(2, dim=1)
        self.k_cache[:, :, rows] = heads[..., 2:] - 1
        k = self.k_cache.repeat_interleave(2, dim=1)
        q = x.view(1, x.shape[1], 4, 3)[..., :1].expand(1, x.shape[1], 4, 4).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return (y, v * 1.0) if self.v_read else y


def _repeated_pm(model, passes=None):
    t = torch.export.Dim("T", min=1, max=7)
    return _lower(model, [torch.randn(1, 3, 12), torch.tensor([0])], "webgpu", passes=passes,
                  dynamic_shapes=({1: t}, None))


@pytest.mark.parametrize("device", EXECUTORS)
def test_a_cache_repeated_for_the_sdpa_before_the_other_write_still_pairs(device):
    # the sdpa reads the cache itself (its GQA reads head h // 2): the repeat is no read of it
    pm = _repeated_pm(RepeatedCaches())
    assert _ops(pm).count("slice_scatter_pair") == 1 and "slice_scatter_" not in _ops(pm)
    eager, feeds = RepeatedCaches(), [(torch.randn(1, t, 12), torch.tensor([p]))
                                      for p, t in ((0, 3), (3, 1), (4, 7), (9, 2))]
    got = run_pte(pm, [list(f) for f in feeds], device)
    base = run_pte(_repeated_pm(RepeatedCaches(), UNFUSED_SPEC), [list(f) for f in feeds], device)
    for (x, at), (out,), (b,) in zip(feeds, got, base):
        assert torch.equal(out, b)
        torch.testing.assert_close(out, eager(x, at), **tol("model", device))


def test_a_cache_repeated_into_a_real_copy_before_the_other_write_stays_two():
    on, off = (_repeated_pm(RepeatedCaches(v_read=True), p) for p in (None, UNFUSED_SPEC))
    assert _ops(on).count("slice_scatter_") == 2 and "slice_scatter_pair" not in _ops(on)
    assert _blobs(on) == _blobs(off)

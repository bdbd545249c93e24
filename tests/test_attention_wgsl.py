"""Flash attention on WebGPU (lavapipe in CI) against eager torch SDPA in float64.

Prefill and the one-pass decode run through the WebGPU executor. The flash-decoding split path
needs scratch operands (Dispatch.scratch), so `run_split` binds them itself, as the executor
is asked to: one buffer per scratch operand, numbered after the outputs; the prefill split
tests shrink PREFILL_SPLIT_KEYS to one key tile, so small prime shapes run several splits, and
check that they did (`launches`). q_dims / k_dims / v_dims / out_dims (q, k and v read through
a permutation, the output written through one) are checked against the reference computed on
the permuted copies, and k and v's against the kernel's own result on those copies bit for
bit."""
import pytest
import torch
import torch.nn.functional as F

import kernels_wgsl
import kernels_wgsl.device
from delegate.ops import get_op
from kernels_wgsl import attention
from tests.test_kernels_wgsl import rand, run_wgsl, sdpa_attrs
from tests.tolerances import tol


def reference(q, k, v, mask=None, causal=False, scale=None, gqa=False):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          scale=scale, enable_gqa=gqa)


def check(got, want):
    torch.testing.assert_close(got, want.to(got.dtype), equal_nan=True, **tol("attention", "webgpu"))


def qkv(b, hq, hkv, l, s, e, ev=None):
    return rand(b, hq, l, e), rand(b, hkv, s, e), rand(b, hkv, s, ev or e)


def build_split(ins, attrs):
    """(the sdpa builder's dispatches with scratch bound, input shapes, output shape)."""
    from kernels_wgsl.device import get_device

    shapes = [None if t is None else tuple(t.shape) for t in ins]
    out_shape, = get_op("sdpa").infer(shapes, attrs)
    dtypes = tuple(None if t is None else t.dtype for t in ins)
    specs = kernels_wgsl.get_kernel("sdpa").build(
        shapes, [out_shape], attrs, kernels_wgsl.BuildInfo(get_device(), dtypes, scratch=True))
    return specs, shapes, out_shape


def launches(ins, attrs) -> dict:
    """{entry: workgroups} of the dispatches run_split launches at these shapes."""
    specs, shapes, out_shape = build_split(ins, attrs)
    counts = {s.entry: s.sizes(shapes, [out_shape], attrs)[1] for s in specs}
    return {entry: n for entry, n in counts.items() if n}


def run_split(ins, attrs):
    """Run the sdpa builder's dispatches with its scratch bound (the split path)."""
    import wgpu

    from kernels_wgsl.device import get_device

    gpu = get_device()
    ins32 = [None if t is None else (t.float() if t.is_floating_point() else t.to(torch.int32))
             for t in ins]
    specs, shapes, out_shape = build_split(ins, attrs)
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    dev = gpu.device

    def buffer(nbytes, data=None):
        if data is not None:
            return dev.create_buffer_with_data(data=data + bytes(max(0, 16 - len(data))), usage=usage)
        return dev.create_buffer(size=max(16, nbytes), usage=usage)

    operands = [None if t is None else buffer(0, t.contiguous().numpy().tobytes()) for t in ins32]
    operands.append(buffer(4 * torch.Size(out_shape).numel()))
    operands += [buffer(max(n for spec in specs for n in spec.scratch[j:j + 1]))
                 for j in range(max(len(spec.scratch) for spec in specs))]
    dummy = buffer(16)
    encoder = dev.create_command_encoder()
    for spec in specs:
        params, count = spec.sizes(shapes, [out_shape], attrs)
        if count == 0:
            continue
        key, pipeline, layout = gpu.acquire_pipeline(
            kernels_wgsl.source(spec.shader, spec.prelude), spec.entry, spec.constants, spec.kinds())
        uniform = dev.create_buffer_with_data(data=params, usage=wgpu.BufferUsage.UNIFORM)
        bufs = [uniform] + [dummy if a is None else operands[a] for a in spec.args]
        group = dev.create_bind_group(layout=layout, entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
            for i, b in enumerate(bufs)])
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(count, 1, 1)
        compute.end()
        gpu.release_pipeline(key)
    dev.queue.submit([encoder.finish()])
    raw = dev.queue.read_buffer(operands[len(ins)])
    return torch.frombuffer(bytearray(raw), dtype=torch.float32)[:torch.Size(out_shape).numel()] \
        .reshape(out_shape).clone(), [s.entry for s in specs]


def both_paths(ins, attrs):
    """(one-pass result via the executor, split result via run_split)."""
    return run_wgsl("sdpa", ins, attrs)[0], run_split(ins, attrs)[0]


# ---- tile choice ----------------------------------------------------------------------------
@pytest.mark.parametrize("e", [5, 8, 64, 128, 200, 256])
def test_tile_fits_default_limits(e):
    tile = attention.flash_tile(e, e, 16384)
    assert tile.threads <= 256
    assert attention.shared_floats(tile.g, tile.vec, tile.br, tile.bc) * 4 <= 16384
    assert tile.g * tile.vec * 4 >= e and tile.vec * 4 <= attention.DIMS_PER_THREAD


def test_split_scratch_is_sized_for_the_upper_bounds():
    shapes = [(1, 8, 1, 64), (1, 2, 2048, 64), (1, 2, 2048, 64), None]
    splits, per = attention.key_splits(1, 2048, 8, 64, 32)
    assert splits * per >= 2048 and (splits - 1) * per < 2048
    assert per % attention.DECODE_CHUNK == 0
    assert attention.partials_bytes(shapes, True, 32, 64) == 8 * splits * (64 + 2) * 4


@pytest.mark.parametrize("keys", [33, 130, 512, 2048, 9000])
def test_prefill_splits_start_on_key_tiles_and_cover_the_keys(keys):
    splits, per = attention.key_splits(512, keys, 32 * 512, 64, 32)
    assert (per % 32 == 0 or splits == 1) and splits <= attention.MAX_SPLITS
    assert splits * per >= keys and (splits - 1) * per < keys
    if keys == 512:
        assert (splits, per) == (4, attention.PREFILL_SPLIT_KEYS)


def test_prefill_splits_only_a_grid_short_of_the_gpu_and_the_scratch_holds_every_l():
    """Causal self-attention, 32 heads, d = 64, L bound 2048, tiles of 64 rows: from L = 449
    (8 row tiles, a grid of 256 = PREFILL_MIN_GRID) nothing splits; below, as far as the grid
    falls short (L = 448: 224 workgroups, 2 splits; L = 64: 32, 8). The scratch is the most any
    L takes (L = 448's 2 x 14336 rows), far below what 16 splits at L = 2048 would need."""
    shapes = [(1, 32, 2048, 64), (1, 32, 2048, 64), (1, 32, 2048, 64), None]
    scratch = attention.partials_bytes(shapes, True, 32, 64)
    assert scratch == attention.record_bytes(32 * 448, 64, 2)
    assert attention.key_splits(512, 512, 32 * 512, 64, 32, scratch, grid=256)[0] == 1
    assert attention.key_splits(2048, 2048, 32 * 2048, 64, 32, scratch, grid=1024)[0] == 1
    assert attention.key_splits(448, 448, 32 * 448, 64, 32, scratch, grid=224)[0] == 2
    assert attention.key_splits(64, 2048, 32 * 64, 64, 32, scratch, grid=32)[0] == 8
    assert attention.key_splits(64, 2048, 32 * 64, 64, 32, 0, grid=32)[0] == 1   # no scratch


def test_prefill_scratch_stops_at_its_bound(monkeypatch):
    # a grid that never fills (PREFILL_MIN_GRID raised): 16 splits at L = 2048 would be 277 MB
    monkeypatch.setattr(attention, "PREFILL_MIN_GRID", 1 << 20)
    shapes = [(1, 32, 2048, 64), (1, 32, 2048, 64), (1, 32, 2048, 64), None]
    scratch = attention.partials_bytes(shapes, True, 32, 64)
    assert scratch == attention.PREFILL_PARTIALS_BYTES
    assert attention.key_splits(2048, 2048, 32 * 2048, 64, 32, scratch, grid=1024)[0] == 3


# ---- prefill ----------------------------------------------------------------------------------
PRIME_LS = [(1, 1), (2, 7), (7, 2), (31, 31), (67, 130), (130, 67)]


@pytest.mark.parametrize("e", [5, 8, 64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_over_prime_lengths(e, causal):
    for l, s in PRIME_LS[:4] if e >= 128 else PRIME_LS:
        q, k, v = qkv(1, 2, 2, l, s, e)
        got = run_wgsl("sdpa", [q, k, v, None], sdpa_attrs(causal=causal))[0]
        check(got, reference(q, k, v, causal=causal))


@pytest.mark.parametrize("e", [64, 256])
def test_prefill_long_causal_skips_tiles_above_the_diagonal(e):
    q, k, v = qkv(1, 1, 1, 130, 130, e)
    got = run_wgsl("sdpa", [q, k, v, None], sdpa_attrs(causal=True, scale=0.2))[0]
    check(got, reference(q, k, v, causal=True, scale=0.2))


def test_value_dim_differs_from_key_dim():
    q, k, v = qkv(2, 3, 3, 31, 67, 29, ev=11)
    check(run_wgsl("sdpa", [q, k, v, None], sdpa_attrs())[0], reference(q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_heads_share_kv(causal):
    q, k, v = qkv(2, 8, 2, 67, 31, 64)
    got = run_wgsl("sdpa", [q, k, v, None], sdpa_attrs(causal=causal, gqa=True))[0]
    check(got, reference(q, k, v, causal=causal, gqa=True))


def test_bool_mask_broadcast_over_batch():
    q, k, v = qkv(2, 3, 3, 31, 67, 8)
    mask = torch.rand(1, 3, 31, 67) > 0.5
    mask[..., 0] = True
    check(run_wgsl("sdpa", [q, k, v, mask], sdpa_attrs())[0], reference(q, k, v, mask))


def test_float_mask_broadcast_over_heads_with_gqa():
    q, k, v = qkv(1, 8, 2, 7, 130, 64)
    mask = rand(1, 1, 7, 130)
    got = run_wgsl("sdpa", [q, k, v, mask], sdpa_attrs(gqa=True))[0]
    check(got, reference(q, k, v, mask, gqa=True))


@pytest.mark.parametrize("forced", [*attention.PREFILL_TILES, None])
@pytest.mark.parametrize("e", [5, 64, 128])
def test_each_prefill_tile_and_the_flash_fallback(monkeypatch, forced, e):
    """Every register-blocked tile (None: no tile, so the one-row-per-thread flash) on causal
    GQA, ragged rows and keys, a float mask and K != V."""
    monkeypatch.setattr(attention, "PREFILL_TILES", (forced,) if forced else ())
    storage = kernels_wgsl.device.get_device().limits["max-compute-workgroup-storage-size"]
    tile = attention.prefill_tile(e, e, storage)
    if forced and tile is None:
        pytest.skip(f"tile {forced} at E={e} needs more than this adapter's {storage} bytes")
    entry = "prefill" if forced else "flash"
    q, k, v = qkv(1, 8, 2, 67, 130, e)
    got, entries = run_split([q, k, v, None], sdpa_attrs(causal=True, gqa=True))
    assert entries == ["decode", entry, "combine"]
    check(got, reference(q, k, v, causal=True, gqa=True))
    q, k, v = qkv(2, 3, 3, 130, 67, e, ev=e + 3)
    mask = rand(1, 1, 130, 67)
    check(run_split([q, k, v, mask], sdpa_attrs())[0], reference(q, k, v, mask))


@pytest.mark.parametrize("l", [5, 20])
def test_a_partly_filled_cache_reads_its_kv_len_keys_at_the_causal_offset(l):
    """A KV cache of 300 rows filled to 150: queries at positions 150 - l .. 149 see keys up to
    their own position (decode kernel at l = 5, prefill at l = 20)."""
    q, k, v = qkv(1, 8, 2, l, 300, 64)
    attrs = {**sdpa_attrs(causal=True, gqa=True), "kv_len": 150, "causal_offset": 150 - l}
    keep = torch.ones(l, 150, dtype=torch.bool).tril(150 - l)
    want = reference(q, k[:, :, :150], v[:, :, :150], mask=keep, gqa=True)
    for got in both_paths([q, k, v, None], attrs):
        check(got, want)


def test_the_dispatches_sharing_a_params_slot_pack_the_same_params():
    """decode, prefill and combine share one params slot (Dispatch.shared_params): sound only
    while they pack the same bytes at every live shape."""
    gpu = kernels_wgsl.device.get_device()
    ins, outs = [(1, 8, 64, 64), (1, 2, 300, 64), (1, 2, 300, 64), None], [(1, 8, 64, 64)]
    attrs = {**sdpa_attrs(causal=True, gqa=True), "kv_len": 150, "causal_offset": 100}
    specs = kernels_wgsl.get_kernel("sdpa").build(
        ins, outs, attrs, kernels_wgsl.BuildInfo(gpu, (torch.float32,) * 3 + (None,), True))
    assert [s.entry for s in specs] == ["decode", "prefill", "combine"]
    assert [s.shared_params for s in specs] == [False, True, True]
    for l in (1, 5, 8, 9, 64):
        live = [(1, 8, l, 64)] + ins[1:]
        assert len({s.sizes(live, outs, attrs)[0] for s in specs}) == 1


# ---- prefill split over the keys (flash-decoding's partials and combine) ---------------------
SPLIT_AT = 32   # keys per prefill split here: one key tile (every PREFILL_TILES' P_BC)


@pytest.fixture
def split_prefill(monkeypatch):
    """Prefill splits every SPLIT_AT keys, so small shapes run several splits."""
    monkeypatch.setattr(attention, "PREFILL_SPLIT_KEYS", SPLIT_AT)


def split_prefill_run(ins, attrs):
    """The split prefill's result, after checking that it runs several splits and combines."""
    assert sorted(launches(ins, attrs)) == ["combine", "prefill"]
    return run_split(ins, attrs)[0]


@pytest.mark.usefixtures("split_prefill")
@pytest.mark.parametrize("e", [5, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_split_prefill_over_prime_lengths(e, causal):
    """Ragged rows and keys; causal, the first row tile's last splits lie above its diagonal."""
    for l, s in ((11, 67), (67, 130), (130, 67)):
        q, k, v = qkv(1, 2, 2, l, s, e)
        check(split_prefill_run([q, k, v, None], sdpa_attrs(causal=causal)),
              reference(q, k, v, causal=causal))


def test_prefill_splits_a_model_shaped_prompt_at_the_default_split_keys():
    """Llama-shaped GQA (8 query heads on 2, d = 64), a causal prompt of 257 tokens: 3 splits
    of PREFILL_SPLIT_KEYS or fewer keys, through the executor and run_split."""
    q, k, v = qkv(1, 8, 2, 257, 257, 64)
    attrs = sdpa_attrs(causal=True, gqa=True)
    assert sorted(launches([q, k, v, None], attrs)) == ["combine", "prefill"]
    for got in both_paths([q, k, v, None], attrs):
        check(got, reference(q, k, v, causal=True, gqa=True))


@pytest.mark.usefixtures("split_prefill")
@pytest.mark.parametrize("causal", [False, True])
def test_split_prefill_grouped_query_heads(causal):
    q, k, v = qkv(2, 8, 2, 37, 101, 64, ev=29)
    got = split_prefill_run([q, k, v, None], sdpa_attrs(causal=causal, gqa=True))
    check(got, reference(q, k, v, causal=causal, gqa=True))


@pytest.mark.usefixtures("split_prefill")
def test_split_prefill_reads_a_cache_window_at_the_causal_offset():
    """A cache of 300 rows filled to 150, 20 queries at 130..149: both the executor and the
    run_split path."""
    q, k, v = qkv(1, 8, 2, 20, 300, 64)
    attrs = {**sdpa_attrs(causal=True, gqa=True), "kv_len": 150, "causal_offset": 130}
    keep = torch.ones(20, 150, dtype=torch.bool).tril(130)
    want = reference(q, k[:, :, :150], v[:, :, :150], mask=keep, gqa=True)
    assert sorted(launches([q, k, v, None], attrs)) == ["combine", "prefill"]
    for got in both_paths([q, k, v, None], attrs):
        check(got, want)


@pytest.mark.usefixtures("split_prefill")
def test_split_prefill_with_bool_and_float_masks():
    q, k, v = qkv(2, 3, 3, 31, 67, 8)
    bmask = torch.rand(1, 3, 31, 67) > 0.5
    bmask[..., 40] = True
    check(split_prefill_run([q, k, v, bmask], sdpa_attrs()), reference(q, k, v, bmask))
    fmask = rand(1, 1, 31, 67)
    check(split_prefill_run([q, k, v, fmask], sdpa_attrs()), reference(q, k, v, fmask))


@pytest.mark.usefixtures("split_prefill")
def test_split_prefill_fully_masked_row_is_zero():
    q, k, v = qkv(1, 2, 2, 13, 97, 8)
    mask = torch.ones(13, 97, dtype=torch.bool)
    mask[5] = False
    want = reference(q, k, v, mask)
    got = split_prefill_run([q, k, v, mask], sdpa_attrs())
    assert torch.equal(got[0, :, 5], torch.zeros(2, 8))
    check(got, want)


@pytest.mark.usefixtures("split_prefill")
def test_split_prefill_rows_with_every_score_far_below_zero():
    """Scores of -128 and less (e^s underflows f32): a split above a tile's diagonal must weigh
    0 in combine however small its rows' real maxima are."""
    q, k, v = qkv(1, 2, 2, 67, 130, 8)
    q, k = -(q.abs() + 1), k.abs() + 1
    attrs = sdpa_attrs(causal=True, scale=16.0)
    check(split_prefill_run([q, k, v, None], attrs), reference(q, k, v, causal=True, scale=16.0))


def split_nan_cases():
    q, k, v = qkv(1, 2, 2, 67, 130, 8)
    nq = q.clone()
    nq[0, 0, 9, 2] = float("nan")          # one query row NaN
    nk = k.clone()
    nk[0, 1, 50, 0] = float("nan")         # a NaN key in the second split (causal: rows >= 50)
    nv = v.clone()
    nv[0, 0, 100, 3] = float("nan")        # a NaN value in the fourth split (causal: none)
    nv0 = v.clone()
    nv0[0, 0, 40, 3] = float("nan")        # causal: every row of a tile holding key 40
    inf_mask = torch.zeros(67, 130, dtype=torch.float64)
    inf_mask[20, 100] = float("inf")       # +inf bias: row NaN
    return [([nq, k, v, None], {}), ([q, nk, v, None], {}), ([q, k, nv, None], {}),
            ([q, k, nv0, None], {"causal": True}), ([q, nk, v, None], {"causal": True}),
            ([q, k, v, inf_mask], {})]


@pytest.mark.parametrize("case", range(6))
def test_split_prefill_places_nan_as_the_one_pass_kernel(monkeypatch, case):
    ins, kw = split_nan_cases()[case]
    whole = run_split(ins, sdpa_attrs(**kw))[0]
    monkeypatch.setattr(attention, "PREFILL_SPLIT_KEYS", SPLIT_AT)
    got = split_prefill_run(ins, sdpa_attrs(**kw))
    assert whole.isnan().any() and torch.equal(got.isnan(), whole.isnan())
    check(got, whole)


@pytest.mark.usefixtures("split_prefill")
@pytest.mark.parametrize("held", [2, 1])
def test_split_prefill_takes_the_splits_its_partials_bound_holds(monkeypatch, held):
    """PREFILL_PARTIALS_BYTES room for `held` splits' partials: 5 splits of 130 keys clamp to
    `held` (1: one pass, no combine), still correct."""
    q, k, v = qkv(1, 2, 2, 67, 130, 8)
    attrs = sdpa_attrs(causal=True)
    bound = attention.record_bytes(2 * 67, 8, held + 1) - 4
    monkeypatch.setattr(attention, "PREFILL_PARTIALS_BYTES", bound)
    monkeypatch.setattr(attention, "PREFILL_SPLIT_KEYS", 1 << 20)
    one_pass = launches([q, k, v, None], attrs)["prefill"]
    monkeypatch.setattr(attention, "PREFILL_SPLIT_KEYS", SPLIT_AT)
    ran = launches([q, k, v, None], attrs)
    assert ran["prefill"] == held * one_pass and ("combine" in ran) == (held > 1)
    check(run_split([q, k, v, None], attrs)[0], reference(q, k, v, causal=True))


@pytest.mark.usefixtures("split_prefill")
def test_the_flash_fallback_takes_one_split(monkeypatch):
    monkeypatch.setattr(attention, "PREFILL_TILES", ())
    q, k, v = qkv(1, 2, 2, 67, 130, 8)
    assert sorted(launches([q, k, v, None], sdpa_attrs(causal=True))) == ["flash"]
    check(run_split([q, k, v, None], sdpa_attrs(causal=True))[0],
          reference(q, k, v, causal=True))


# ---- decode -----------------------------------------------------------------------------------
@pytest.mark.parametrize("s", [1, 31, 257])
def test_decode_gqa_one_query(s):
    q, k, v = qkv(1, 8, 2, 1, s, 64)
    attrs = sdpa_attrs(gqa=True)
    want = reference(q, k, v, gqa=True)
    for got in both_paths([q, k, v, None], attrs):
        check(got, want)


def test_decode_splits_2048_keys_and_combines():
    q, k, v = qkv(1, 8, 2, 1, 2048, 64)
    got, entries = run_split([q, k, v, None], sdpa_attrs(gqa=True))
    assert entries == ["decode", "combine"]
    check(got, reference(q, k, v, gqa=True))


@pytest.mark.parametrize("e", [5, 256])
def test_decode_split_with_masks_and_short_rows(e):
    q, k, v = qkv(1, 4, 4, 3, 257, e)
    mask = rand(1, 4, 3, 257)
    check(run_split([q, k, v, mask], sdpa_attrs())[0], reference(q, k, v, mask))
    bmask = torch.rand(3, 257) > 0.7
    check(run_split([q, k, v, bmask], sdpa_attrs())[0], reference(q, k, v, bmask))
    check(run_split([q, k, v, None], sdpa_attrs(causal=True))[0], reference(q, k, v, causal=True))


# ---- q, k and v read through a permutation, the output written through one -----------------
HEADS_MAJOR = [0, 2, 1, 3]   # Llama's q/k/v.transpose(1, 2), and the transpose back
READS = ("q_dims", "k_dims", "v_dims")
LAYOUTS = {"q": {"q_dims": HEADS_MAJOR}, "out": {"out_dims": HEADS_MAJOR},
           "both": {"q_dims": HEADS_MAJOR, "out_dims": HEADS_MAJOR},
           "k": {"k_dims": HEADS_MAJOR}, "v": {"v_dims": HEADS_MAJOR},
           "kv": {"k_dims": HEADS_MAJOR, "v_dims": HEADS_MAJOR},
           "all": {key: HEADS_MAJOR for key in (*READS, "out_dims")}}


def stored_as(x, dims):
    """The contiguous tensor whose permute(dims) is x (x itself without dims)."""
    return x.permute(*[dims.index(i) for i in range(x.dim())]).contiguous() if dims else x


def through_layouts(attrs, *operands):
    """q, k and v (as many as given) as inputs 0, 1 and 2 store them; out_of(stored) gives the
    output back as [B, Hq, L, Ev]."""
    stored = [stored_as(x, attrs.get(key)) for x, key in zip(operands, READS)]

    def out_of(out):
        dims = attrs.get("out_dims")
        return out.permute(*[dims.index(i) for i in range(4)]) if dims else out

    return stored, out_of


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("l, s", [(1, 31), (3, 257), (7, 11), (67, 130)])
def test_layouts_over_gqa_causal_prime_shapes(layout, l, s):
    """Decode (l <= 8, one pass and split) and prefill, GQA, the last l of s positions causal
    (a cache's rows, so even one query row sees every key), a head dim of 29 (f32 loads) and
    of 64 (vec4 loads)."""
    keep = torch.ones(l, s, dtype=torch.bool).tril(s - l)
    attrs = {**sdpa_attrs(causal=True, gqa=True), **LAYOUTS[layout], "causal_offset": s - l}
    for e, ev in ((29, 29), (64, 16)):
        q, k, v = qkv(1, 6, 2, l, s, e, ev)
        stored, out_of = through_layouts(attrs, q, k, v)
        want = reference(q, k, v, mask=keep, gqa=True)
        for got in both_paths([*stored, None], attrs):
            check(out_of(got), want)


@pytest.mark.parametrize("forced", [attention.PREFILL_TILES[-1], None])
def test_layouts_through_the_prefill_tile_and_the_flash_fallback(monkeypatch, forced):
    monkeypatch.setattr(attention, "PREFILL_TILES", (forced,) if forced else ())
    attrs = {**sdpa_attrs(causal=True, gqa=True), **LAYOUTS["all"]}
    q, k, v = qkv(2, 6, 3, 67, 130, 64)
    stored, out_of = through_layouts(attrs, q, k, v)
    got, entries = run_split([*stored, None], attrs)
    assert entries == ["decode", "prefill" if forced else "flash", "combine"]
    check(out_of(got), reference(q, k, v, causal=True, gqa=True))


def test_layouts_with_a_cache_window_and_a_float_mask():
    q, k, v = qkv(1, 4, 2, 5, 300, 64)
    attrs = {**sdpa_attrs(causal=True, gqa=True), **LAYOUTS["all"], "kv_len": 150,
             "causal_offset": 145}
    stored, out_of = through_layouts(attrs, q, k, v)
    keep = torch.ones(5, 150, dtype=torch.bool).tril(145)
    want = reference(q, k[:, :, :150], v[:, :, :150], mask=keep, gqa=True)
    for got in both_paths([*stored, None], attrs):
        check(out_of(got), want)
    mask, attrs = rand(1, 1, 5, 300), {**sdpa_attrs(gqa=True), **LAYOUTS["all"]}
    for got in both_paths([*stored, mask], attrs):
        check(out_of(got), reference(q, k, v, mask, gqa=True))


# name -> (l, s, e, ev, mask kind): decode (l <= DECODE_L) in one pass, and split over 257
# keys (more than SPLIT_KEYS) with its combine; the register-blocked prefill; the
# one-row-per-thread flash (E = 256); f32 loads (E or Ev 5) and vec4 loads (E = Ev = 12)
KV_CASES = {"decode-e5-causal": (7, 13, 5, 5, "causal"),
            "decode-e12-float": (7, 13, 12, 12, "float"),
            "combine-e5-float": (1, 257, 5, 5, "float"),
            "combine-e12-bool": (3, 257, 12, 12, "bool"),
            "combine-e256-causal": (1, 257, 256, 256, "causal"),
            "prefill-e5-bool": (11, 13, 5, 5, "bool"),
            "prefill-e12-float": (11, 13, 12, 12, "float"),
            "prefill-e12-ev5-causal": (67, 130, 12, 5, "causal"),
            "flash-e256-bool": (11, 13, 256, 256, "bool")}


def kv_case_mask(kind, l, s):
    """(attn_mask, attrs) of a KV_CASES mask kind; causal: the last l of s positions."""
    if kind == "causal":
        return None, {**sdpa_attrs(causal=True, gqa=True), "causal_offset": s - l}
    if kind == "bool":
        mask = torch.rand(1, 6, l, s) > 0.4
        mask[..., 0] = True
        return mask, sdpa_attrs(gqa=True)
    return rand(2, 1, l, s), sdpa_attrs(gqa=True)


@pytest.mark.parametrize("dims", [HEADS_MAJOR, [2, 0, 1, 3]], ids=["heads-major", "seq-first"])
@pytest.mark.parametrize("case", sorted(KV_CASES))
def test_k_and_v_read_through_a_permutation_match_their_copies_bit_for_bit(case, dims):
    """GQA (6 query heads on 2), batch 2, k and v read through dims: the kernel's own result
    on contiguous copies bit for bit (same entries), and float64 torch within the tolerance."""
    l, s, e, ev, kind = KV_CASES[case]
    torch.manual_seed(len(case))
    q, k, v = qkv(2, 6, 2, l, s, e, ev)
    mask, attrs = kv_case_mask(kind, l, s)
    through = {**attrs, "k_dims": dims, "v_dims": dims}
    stored, _ = through_layouts(through, q, k, v)
    got, entries = run_split([*stored, mask], through)
    base, base_entries = run_split([q, k, v, mask], attrs)
    assert case.split("-")[0] in entries and entries == base_entries
    assert torch.equal(got, base)
    keep = torch.ones(l, s, dtype=torch.bool).tril(s - l) if kind == "causal" else mask
    check(got, reference(q, k, v, mask=keep, gqa=True))


# ---- NaN / Inf, as eager torch ------------------------------------------------------------
def nan_cases():
    q, k, v = qkv(1, 2, 2, 3, 131, 8)
    nq = q.clone()
    nq[0, 0, 1, 2] = float("nan")          # one query row NaN
    nk = k.clone()
    nk[0, 1, 5, 0] = float("nan")          # a NaN key every row sees
    nv = v.clone()
    nv[0, 0, 100, 3] = float("nan")        # one value column NaN
    inf_mask = torch.zeros(3, 131, dtype=torch.float64)
    inf_mask[2, 7] = float("inf")          # +inf bias: row NaN (e^(inf - inf))
    dead = torch.ones(3, 131, dtype=torch.bool)
    dead[1] = False                        # a fully masked row: torch's eager CPU SDPA gives 0
    masked_nan_k = torch.ones(3, 131, dtype=torch.bool)
    masked_nan_k[:, 5] = False             # torch adds -inf to a NaN score: still NaN
    nv0 = v.clone()
    nv0[0, 1, 0, 3] = float("nan")         # causal: key 0 is every row's (keys past the
    #                                        diagonal reach rows as torch's CPU blocks happen to)
    return [([nq, k, v, None], {}), ([q, nk, v, None], {}), ([q, k, nv, None], {}),
            ([q, k, v, inf_mask], {}), ([q, k, v, dead], {}), ([q, nk, v, masked_nan_k], {}),
            ([nq, k, nv0, None], {"causal": True})]


@pytest.mark.parametrize("case", range(7))
def test_nan_and_inf_follow_torch(case):
    ins, kw = nan_cases()[case]
    want = reference(*ins[:3], ins[3], **kw)
    for got in both_paths(ins, sdpa_attrs(**kw)):
        check(got, want)


def test_fully_masked_row_is_zero_like_torch():
    q, k, v = qkv(1, 1, 1, 2, 5, 8)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[0] = False
    want = reference(q, k, v, mask)
    assert torch.equal(want[0, 0, 0], torch.zeros(8, dtype=torch.float64))
    for got in both_paths([q, k, v, mask], sdpa_attrs()):
        check(got, want)


# ---- partitioner: claims only what the WGSL kernel runs -------------------------------------
def keeps_sdpa_whole(device: str, head: int) -> bool:
    """Whether the partitioner keeps SDPA from decomposition, i.e. claims it as our op."""
    from delegate.partitioner import WgpuPartitioner

    class Attend(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    xs = tuple(torch.randn(1, 2, 3, head) for _ in range(3))
    kept, _ = WgpuPartitioner(device=device).ops_to_not_decompose(torch.export.export(Attend(), xs))
    return torch.ops.aten.scaled_dot_product_attention.default in kept


def test_webgpu_partitioner_leaves_head_dims_over_256_to_decomposition():
    assert keeps_sdpa_whole("webgpu", attention.MAX_HEAD)
    assert not keeps_sdpa_whole("webgpu", attention.MAX_HEAD + 8)


def test_cpu_partitioner_claims_any_head_dim():
    assert keeps_sdpa_whole("cpu", attention.MAX_HEAD + 8)

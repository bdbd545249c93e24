"""ExecuTorch's own Llama definition (examples/models/llama, as the wheel ships it) with its
KV cache, lowered by our partitioner: one delegate call, the caches resident in it, prefill and
decode steps matching eager on both executors, fp32 and torchao int4-g32."""
import pytest
import torch

from delegate.aot import undelegated_ops
from delegate.runtime.program import Runtime
from tests.once import once
from tests.test_pass_swiglu import _lower
from tests.tolerances import tol

VOCAB = 128
ARGS = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=VOCAB, hidden_dim=128,
            max_seq_len=32, max_context_len=32, use_kv_cache=True, enable_dynamic_shape=True,
            generate_full_logits=False)


def tiny_llama(**overrides):
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(0)
    return construct_transformer(ModelArgs(**{**ARGS, **overrides})).eval().requires_grad_(False)


def int4_g32(model):
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    return model


def _logits(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def custom_ops(model):
    """ExecuTorch's custom-op graph form: llama.update_cache and llama.custom_sdpa
    (examples/models/llama/source_transformation)."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (registers the ops)
    from executorch.examples.models.llama.source_transformation.custom_kv_cache import (
        replace_kv_cache_with_custom_kv_cache)
    from executorch.examples.models.llama.source_transformation.sdpa import (
        replace_sdpa_with_custom_op)

    return replace_sdpa_with_custom_op(replace_kv_cache_with_custom_kv_cache(model))


def _built(quantize: bool, form: str, **overrides):
    model = tiny_llama(**overrides)
    model = int4_g32(model) if quantize else model
    return custom_ops(model) if form == "custom" else model


def lower_llama(device, quantize=False, form="plain", passes=None, **overrides):
    """The program manager of one tiny Llama, tokens [1, T] (T dynamic) and input_pos; passes
    as WgpuPartitioner takes them (None: every pass)."""
    seq = torch.export.Dim("T", min=1, max=16)
    example = (torch.randint(0, VOCAB, (1, 4)), {"input_pos": torch.tensor([0])})
    return _lower(_built(quantize, form, **overrides), example, device, passes=passes,
                  dynamic_shapes=({1: seq}, {"input_pos": None}))


def llama_program(device, quantize=False, form="plain", passes=None, **overrides):
    """lower_llama's program manager, lowered once a session per configuration: this file's
    tests and the pass tests (test_pass_*.py) load the same ones, each load with its own
    caches. An override equal to ARGS' own value is no override."""
    changed = {k: v for k, v in overrides.items() if k not in ARGS or ARGS[k] != v}
    return _llama_program(device, quantize, form, passes, **changed)


_llama_program = once(lower_llama)


def _lowered(device, quantize=False, form="plain", **overrides):
    """(eager model, loaded program, program manager) of one tiny Llama; eager is a twin
    holding the same weights (and, quantised, torchao's own int4 linears) and fresh caches."""
    pm = llama_program(device, quantize, form, **overrides)
    eager = _built(quantize, form, **overrides)
    return eager, Runtime.get().load_program(pm.buffer, device=device), pm


def run_steps(pm, device, steps) -> tuple:
    """(logits per step, the delegate's describe(), its dispatch_list() on WebGPU else []) of
    one sequence fed from input_pos 0 on one load (its caches)."""
    prog = Runtime.get().load_program(pm.buffer, device=device)
    try:
        m, pos, out = prog.load_method("forward"), 0, []
        for tokens in steps:
            out.append(_logits(m.execute([tokens, torch.tensor([pos])])))
            pos += tokens.shape[1]
        (_, executor), = m.delegates
        return out, executor.describe(), executor.dispatch_list() if device == "webgpu" else []
    finally:
        prog.destroy()


def _steps(prefill: int, decode: int = 8) -> list:
    torch.manual_seed(1)
    return [torch.randint(0, VOCAB, (1, prefill))] + \
        [torch.randint(0, VOCAB, (1, 1)) for _ in range(decode)]


@pytest.mark.parametrize("quantize", [False, True], ids=["fp32", "int4-g32"])
@pytest.mark.parametrize("form", ["plain", "custom"])
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_tiny_et_llama_runs_in_one_delegate_and_matches_eager(device, form, quantize):
    eager, prog, pm = _lowered(device, quantize, form)
    try:
        assert undelegated_ops(pm) == []   # the caches' writes, the mask, the positions too
        m = prog.load_method("forward")
        (backend, handle), = m.delegates
        if quantize:
            assert "linear_q4gsw" in " ".join(backend.describe(handle)["ops"])
        for prefill in (1, 7, 16):   # each a new sequence from position 0 on the same caches
            pos = 0
            for tokens in _steps(prefill):   # a prefill, then 8 decode steps
                at = torch.tensor([pos])
                want = _logits(eager(tokens, {"input_pos": at}))
                got = _logits(m.execute([tokens, at]))
                torch.testing.assert_close(got, want, **tol("model", device))
                pos += tokens.shape[1]
    finally:
        prog.destroy()


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_custom_sdpa_reads_the_caches_in_place_with_no_permute(device):
    """llama.custom_sdpa's q, caches and output are [B, S, H, D]: its sdpa reads and writes
    them through q/k/v_dims and out_dims, so no step copies a cache into heads-major order."""
    eager, prog, pm = _lowered(device, True, "custom")
    try:
        ops = " ".join(prog.load_method("forward").delegates[0][0].describe(
            prog.load_method("forward").delegates[0][1])["ops"]).split()
        assert not any(op.startswith("permute") for op in ops), ops
        out, described, _ = run_steps(pm, device, _steps(7, decode=2))
        pos, want = 0, []
        for tokens in _steps(7, decode=2):
            want.append(_logits(eager(tokens, {"input_pos": torch.tensor([pos])})))
            pos += tokens.shape[1]
        for got, w in zip(out, want):
            torch.testing.assert_close(got, w, **tol("model", device))
    finally:
        prog.destroy()


@pytest.mark.parametrize("chain,want", [([[0, 2, 1, 3], [0, 2, 1, 3]], []),
                                        ([[1, 0, 2, 3], [0, 2, 1, 3]], [1, 2, 0, 3]),
                                        ([[0, 2, 1, 3]], [0, 2, 1, 3]),
                                        ([[0, 1, 3, 2], [0, 2, 1, 3]], None)])
def test_through_permutes_composes_the_chain_ending_at_a_node(chain, want):
    """x == base.permute(dims) for the base it finds; a permute moving the last dim ends the
    walk (None: the walk stops at the last permute's input)."""
    from delegate.ops.export import through_permutes

    class Chain(torch.nn.Module):
        def forward(self, x):
            for dims in chain:
                x = x.permute(dims)
            return x + 0   # the last permute is not the graph's output itself

    from executorch.exir import EdgeCompileConfig, to_edge

    x = torch.randn(2, 3, 5, 7)
    edge = to_edge(torch.export.export(Chain(), (x,)),
                   compile_config=EdgeCompileConfig(_check_ir_validity=False))
    graph = edge.exported_program().graph
    out = next(n for n in graph.nodes if n.op == "output").args[0][0].args[0]
    base, dims = through_permutes(out)
    if want is None:
        assert base is out.args[0] and dims == list(chain[-1])
        return
    assert base.op == "placeholder" and dims == want
    assert torch.equal(x.permute(dims or [0, 1, 2, 3]) + 0, Chain()(x))


def test_a_webgpu_decode_step_moves_only_the_token_the_params_prefix_and_the_logits():
    eager, prog, _ = _lowered("webgpu")
    try:
        m = prog.load_method("forward")
        (backend, handle), = m.delegates
        m.execute([torch.randint(0, VOCAB, (1, 5)), torch.tensor([0])])
        m.execute([torch.randint(0, VOCAB, (1, 1)), torch.tensor([5])])   # decode's first plan
        before = dict(backend.describe(handle)["plans"])
        for pos in range(6, 12):
            m.execute([torch.randint(0, VOCAB, (1, 1)), torch.tensor([pos])])
            moved = backend.describe(handle)["transfers"]
            # the token id as one i32, then the offset-dependent params prefix: two writes
            assert moved["uploads"] == 2, moved
            assert moved["upload_bytes"] <= 4 + 4 * 256, moved
            assert moved["download_bytes"] == VOCAB * 4, moved   # last-token logits only
        after = backend.describe(handle)["plans"]
        assert after["misses"] == before["misses"]   # every decode step replays one plan
        assert after["hits"] == before["hits"] + 6
    finally:
        prog.destroy()


def _decode_cost(n_layers: int) -> tuple:
    """(params block bytes, a decode step's upload bytes, its logits, eager's) of a tiny
    Llama of n_layers on webgpu, after a prefill of 5."""
    eager, prog, _ = _lowered("webgpu", n_layers=n_layers)
    try:
        m = prog.load_method("forward")
        (backend, handle), = m.delegates
        prefill, token = _steps(5, decode=1)
        m.execute([prefill, torch.tensor([0])])
        got = _logits(m.execute([token, torch.tensor([5])]))
        eager(prefill, {"input_pos": torch.tensor([0])})
        want = _logits(eager(token, {"input_pos": torch.tensor([5])}))
        info = backend.describe(handle)
        return info["params_bytes"], info["transfers"]["upload_bytes"], got, want
    finally:
        prog.destroy()


def test_layers_share_params_so_a_decode_step_uploads_the_same_bytes_at_any_depth():
    # Each layer's steps are twins of layer 0's (same op, shapes, attrs): they share its
    # params slots, so neither the block nor a decode step's params prefix grows with depth.
    two, three = _decode_cost(2), _decode_cost(3)
    assert three[0] == two[0] and three[1] == two[1], (two[:2], three[:2])
    for _, _, got, want in (two, three):
        torch.testing.assert_close(got, want, **tol("model", "webgpu"))


def test_decode_steps_across_key_splits_keep_one_grid_and_finish_ahead():
    # WebGPU's decode sdpa splits the cache's 160 keys into groups of 64 (flash-decoding) at
    # every position; the live ones are kv_len 61 -> 1 split, 65 -> 2, 129 -> 3, and the rest
    # neither run nor weigh. So one decode binding keeps its grids at every position and
    # submits command buffers finished ahead, and the prefills (whose splits follow the live
    # keys) in between still match eager.
    eager, prog, _ = _lowered("webgpu", max_seq_len=160, max_context_len=160)
    try:
        m, pos = prog.load_method("forward"), 0
        torch.manual_seed(2)
        for tokens in [torch.randint(0, VOCAB, (1, 15)) for _ in range(4)] + \
                [torch.randint(0, VOCAB, (1, 1)) for _ in range(10)] + \
                [torch.randint(0, VOCAB, (1, 16)) for _ in range(3)] + \
                [torch.randint(0, VOCAB, (1, 1)) for _ in range(4)]:
            got = _logits(m.execute([tokens, torch.tensor([pos])]))
            want = _logits(eager(tokens, {"input_pos": torch.tensor([pos])}))
            torch.testing.assert_close(got, want, **tol("model", "webgpu"), msg=f"at {pos}")
            pos += tokens.shape[1]
        assert pos == 60 + 10 + 48 + 4   # kv_len 61..70, then 119..122 at 2 splits
        for pos in (126, 127, 128):       # back across 128 -> 129 keys: 3 splits
            tokens = torch.randint(0, VOCAB, (1, 1))
            got = _logits(m.execute([tokens, torch.tensor([pos])]))
            want = _logits(eager(tokens, {"input_pos": torch.tensor([pos])}))
            torch.testing.assert_close(got, want, **tol("model", "webgpu"), msg=f"at {pos}")
        (_, executor), = m.delegates
        assert executor.finished_submits >= 10, executor.finished_submits
        decode = executor.plan.binding_for([tokens, torch.tensor([128])]).payload
        assert decode.grid_sites == {} and decode.regrids == 0 and decode.fixed_grids
    finally:
        prog.destroy()


def test_a_grid_declared_fixed_that_moves_with_the_position_is_a_program_error(monkeypatch):
    # sdpa declares its grids fixed at decode L only: prefill's key splits follow the live
    # keys (15 keys: one split; 150: two). Declared fixed everywhere, the move is caught at
    # the execute that makes it, before any stale grid runs.
    from delegate.errors import ProgramError
    from kernels_wgsl import attention

    monkeypatch.setattr(attention, "decoding", lambda ins, attrs: True)
    _, prog, _ = _lowered("webgpu", max_seq_len=160, max_context_len=160)
    try:
        m = prog.load_method("forward")
        tokens = torch.randint(0, VOCAB, (1, 15))
        m.execute([tokens, torch.tensor([0])])
        with pytest.raises(ProgramError, match="declares fixed at every offset"):
            m.execute([tokens, torch.tensor([135])])
    finally:
        prog.destroy()


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_a_position_past_the_cache_is_a_typed_error(device):
    from delegate.errors import InputError

    _, prog, _ = _lowered(device)
    try:
        m = prog.load_method("forward")
        with pytest.raises(InputError):
            m.execute([torch.randint(0, VOCAB, (1, 4)), torch.tensor([30])])   # 30 + 4 > 32
    finally:
        prog.destroy()


def test_decode_params_computed_ahead_at_the_next_position_match_a_fresh_computation():
    # While the GPU runs a decode step, the executor computes the params of the step one
    # token on (the offsets repeating the last step's move). The next step uses them only at
    # exactly those offsets: a jump, a new binding, or a guess past the cache's end computes
    # its own, and every step's logits are bit-identical to a load that never guesses.
    from delegate.errors import InputError

    _, prog, pm = _lowered("webgpu")
    plain = Runtime.get().load_program(pm.buffer, device="webgpu")
    try:
        m, ref = prog.load_method("forward"), plain.load_method("forward")
        (_, executor), = m.delegates
        (_, never), = ref.delegates
        never.params_ahead = False
        torch.manual_seed(3)
        positions = [(0, 5), (5, 1), (6, 1), (7, 1), (8, 1), (12, 1), (13, 1), (14, 1),
                     (15, 4), (19, 1), (28, 1), (29, 1), (30, 1)]   # export checks pos <= 30
        hits = []
        for pos, t in positions:
            tokens = torch.randint(0, VOCAB, (1, t))
            before = executor.params_ahead_hits
            got = _logits(m.execute([tokens, torch.tensor([pos])]))
            want = _logits(ref.execute([tokens, torch.tensor([pos])]))
            assert torch.equal(got, want), f"at {pos}"
            hits.append(executor.params_ahead_hits - before)
        # guessed right: 7 and 8 (after 5, 6), 14 (after 12, 13), 30 (after 28, 29); the guess
        # after 30 (31) fails the export's check and was dropped, so 31 itself raises it
        assert hits == [0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1], hits
        assert never.params_ahead_hits == 0
        with pytest.raises(InputError):
            m.execute([torch.randint(0, VOCAB, (1, 1)), torch.tensor([31])])
    finally:
        prog.destroy()
        plain.destroy()

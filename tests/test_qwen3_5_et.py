"""ExecuTorch's own Qwen3.5 hybrid (examples/models/llama with Gated DeltaNet and gated
attention layers), built by delegate.llm at test size and lowered by our partitioner: nothing
outside one delegate call (the DeltaNet's state reset `input_pos[0] == 0`, its softplus
`where(x > 20, x, log1p(exp(x)))` and its state writes `copy_` included), its conv and
recurrent states and the KV cache resident there, and a prefill then 8 decode steps matching
eager on both executors; a new prefill at input_pos 0 resets the states."""
import pytest
import torch

from delegate import llm
from delegate.aot import lower, undelegated_ops
from delegate.runtime.program import Runtime
from tests.tolerances import tol

NAME, MAX_SEQ = "tiny-qwen3_5", 24


def delegate_calls(pm) -> int:
    gm = pm.exported_program().graph_module
    return sum("executorch_call_delegate" in str(n.target) for n in gm.graph.nodes)


@pytest.fixture(scope="module", params=["cpu", "webgpu"])
def lowered(request):
    """(device, program manager, eager twin holding the same weights and its own states)."""
    args, dynamic = llm.example_inputs(MAX_SEQ)
    pm = lower(llm.build_model(NAME, MAX_SEQ), args, dynamic_shapes=dynamic,
               device=request.param)
    return request.param, pm, llm.build_model(NAME, MAX_SEQ)


def _steps(prefill: int = 7, decode: int = 8) -> list:
    gen = torch.Generator().manual_seed(1)
    vocab = llm.model_args(NAME, MAX_SEQ).vocab_size
    return [torch.randint(0, vocab, (1, prefill), generator=gen)] + \
        [torch.randint(0, vocab, (1, 1), generator=gen) for _ in range(decode)]


def _run_sequence(method, eager, steps, device) -> list:
    """Feed a prefill at input_pos 0, then one token per step; assert each step's logits
    match eager's; return ours."""
    pos, got_all = 0, []
    for tokens in steps:
        at = torch.tensor([pos])
        with torch.no_grad():
            want = eager(tokens, {"input_pos": at})
        got = method.execute([tokens, at])[0]
        torch.testing.assert_close(got, want, **tol("model", device))
        got_all.append(got)
        pos += tokens.shape[1]
    return got_all


def test_tiny_qwen3_5_is_one_delegate_call_with_nothing_outside(lowered):
    _, pm, _ = lowered
    assert undelegated_ops(pm) == []
    assert delegate_calls(pm) == 1


def test_tiny_qwen3_5_prefill_then_decode_matches_eager_and_a_new_prefill_resets(lowered):
    device, pm, eager = lowered
    prog = Runtime.get().load_program(pm.buffer, device=device)
    try:
        m = prog.load_method("forward")
        (backend, handle), = m.delegates
        args = llm.model_args(NAME, MAX_SEQ)
        conv_dim = 2 * args.linear_num_key_heads * args.linear_key_head_dim + \
            args.linear_num_value_heads * args.linear_value_head_dim
        deltanet = conv_dim * args.linear_conv_kernel_dim + args.linear_num_value_heads * \
            args.linear_key_head_dim * args.linear_value_head_dim
        kv_cache = 2 * args.n_kv_heads * args.max_context_len * args.head_dim
        # one DeltaNet layer and one attention layer, all their state in the delegate
        assert backend.describe(handle)["state_bytes"] == 4 * (deltanet + kv_cache)
        steps = _steps()
        first = _run_sequence(m, eager, steps, device)
        again = _run_sequence(m, eager, steps, device)   # the states were dirty: input_pos 0 resets
        for a, b in zip(first, again):
            torch.testing.assert_close(b, a, **tol("model", device))
    finally:
        prog.destroy()


@pytest.mark.parametrize("quantize", ["none", "int4-g32"])
@pytest.mark.parametrize("form", ["plain", "custom"])
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_tiny_qwen3_5_matches_eager_at_each_prefill_length_in_both_forms(device, form, quantize):
    # issue 10: prefill T in {1, 7, 16} then 8 decode steps, each a new sequence at input_pos 0
    # on the same resident states; the custom-op form (llama.update_cache / custom_sdpa in the
    # attention layers) and torchao int4-g32 linears too, against eager with the same weights
    from tests.test_llm_et import custom_ops

    def build():   # room for 16 + 8 positions: the export checks input_pos <= max_seq - 2
        model = llm.quantize(llm.build_model(NAME, 2 * MAX_SEQ), quantize)
        return custom_ops(model) if form == "custom" else model

    args, dynamic = llm.example_inputs(2 * MAX_SEQ)
    model, eager = build(), build()
    pm = lower(model, args, dynamic_shapes=dynamic, device=device)
    assert undelegated_ops(pm) == [] and delegate_calls(pm) == 1
    prog = Runtime.get().load_program(pm.buffer, device=device)
    try:
        m = prog.load_method("forward")
        for prefill in (1, 7, 16):
            _run_sequence(m, eager, _steps(prefill), device)
    finally:
        prog.destroy()

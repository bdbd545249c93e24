"""ExecuTorch's own Llama definition (examples/models/llama, as the wheel ships it) with its
KV cache, lowered by our partitioner: prefill and decode steps match eager on both executors.

The cache lives in the runner here (index_put / copy_ run outside the delegates); the resident,
delegate-owned cache of the LLM issue will keep these same numbers.
"""
import pytest
import torch

from delegate.aot import lower
from delegate.runtime.program import Runtime
from tests.tolerances import tol

ARGS = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, hidden_dim=128,
            max_seq_len=32, max_context_len=32, use_kv_cache=True, enable_dynamic_shape=True,
            generate_full_logits=True)


def tiny_llama():
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(0)
    return construct_transformer(ModelArgs(**ARGS)).eval().requires_grad_(False)


def _logits(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_tiny_et_llama_prefill_and_decode_match_eager(device):
    model = tiny_llama()
    eager = tiny_llama()
    eager.load_state_dict(model.state_dict())
    seq = torch.export.Dim("T", min=1, max=16)
    example = (torch.randint(0, 128, (1, 4)), {"input_pos": torch.tensor([0])})
    pte = lower(model, example, dynamic_shapes=({1: seq}, {"input_pos": None}),
                device=device).buffer
    prog = Runtime.get().load_program(pte, device=device)
    try:
        m = prog.load_method("forward")
        torch.manual_seed(1)
        steps = [torch.randint(0, 128, (1, 7))] + [torch.randint(0, 128, (1, 1)) for _ in range(8)]
        pos = 0
        for tokens in steps:   # prefill of 7, then 8 decode steps on the same cache
            at = torch.tensor([pos])
            with torch.no_grad():
                want = _logits(eager(tokens, {"input_pos": at}))
            got = _logits(m.execute([tokens, at]))
            torch.testing.assert_close(got, want, **tol("model", device))
            pos += tokens.shape[1]
    finally:
        prog.destroy()

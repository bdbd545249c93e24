"""Real models written by no one here: Hugging Face transformers' Llama, Qwen2, Qwen3 and GPT-2
from tiny configs, and torch's nn.TransformerEncoderLayer, exported with a dynamic sequence
length and lowered by our partitioner. Each must become one delegate call with no op left
outside, on both executors, and match eager at two lengths.

transformers builds the attention mask inside forward (arange, comparisons, bitwise_and,
index, cumsum over int64/bool tensors); those ops being delegated is what keeps each model in
one call. Random weights: a fixed seed, the configs' own initialisation.
"""
import pytest
import torch

from delegate.aot import lower, undelegated_ops
from tests.test_models import DEVICES, assert_matches_eager

transformers = pytest.importorskip("transformers")

VOCAB = 96
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _hf(name: str):
    t = transformers
    if name == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(**TINY))
    if name == "qwen2":
        return t.Qwen2ForCausalLM(t.Qwen2Config(**TINY))
    if name == "qwen3":
        return t.Qwen3ForCausalLM(t.Qwen3Config(head_dim=8, **TINY))
    if name == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                              n_positions=64, bos_token_id=1, eos_token_id=2))
    raise AssertionError(name)


class Logits(torch.nn.Module):
    """token ids [1, T] -> logits [1, T, vocab], no KV cache (one full forward)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def _check_one_call(pm, xs, model, device):
    assert undelegated_ops(pm) == []
    gm = pm.exported_program().graph_module
    calls = [n for n in gm.graph.nodes if n.op == "call_function"
             and "executorch_call_delegate" in str(n.target)]
    assert len(calls) == 1, f"expected one delegate call, got {len(calls)}"
    assert_matches_eager(pm, xs, model, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "gpt2"])
def test_hf_model_is_one_delegate_call_and_matches_eager(name, device):
    torch.manual_seed(0)
    model = Logits(_hf(name).eval())
    seq = torch.export.Dim("seq", min=2, max=48)
    pm = lower(model, (torch.randint(0, VOCAB, (1, 9)),), dynamic_shapes=({1: seq},),
               device=device)
    xs = [torch.randint(0, VOCAB, (1, t)) for t in (5, 48)]
    _check_one_call(pm, xs, model, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer_is_one_delegate_call_and_matches_eager(norm_first, device):
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True,
                                             norm_first=norm_first).eval()
    seq = torch.export.Dim("seq", min=2, max=32)
    pm = lower(model, (torch.randn(1, 9, 32),), dynamic_shapes=({1: seq},), device=device)
    _check_one_call(pm, [torch.randn(1, t, 32) for t in (3, 32)], model, device)

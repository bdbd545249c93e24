"""embedding_q4gsw: a torchao int4 weight-only embedding gathered from the packed weights,
exact against torchao's eager output on both executors."""
import pytest
import torch
from torch import nn

from delegate.aot import lower, undelegated_ops
from delegate.runtime.program import Runtime
from tests.test_q4gsw import lowered_ops


def quantized_embedding(vocab: int, dim: int, gs: int):
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(vocab, dim)).eval()
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(gs)),
              filter_fn=lambda m, fqn: isinstance(m, nn.Embedding))
    return model


@pytest.mark.parametrize("vocab,dim,gs", [(37, 64, 32), (11, 128, 64), (5, 256, 128)])
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_int4_embedding_is_delegated_and_exact(device, vocab, dim, gs):
    model = quantized_embedding(vocab, dim, gs)
    idx = torch.randint(0, vocab, (2, 13))
    pm = lower(model, (idx,), device=device)
    assert undelegated_ops(pm) == []
    assert lowered_ops(pm) == ["embedding_q4gsw"]
    prog = Runtime.get().load_program(pm.buffer, device=device)
    try:
        m = prog.load_method("forward")
        for ids in (idx, torch.tensor([[0, vocab - 1] * 6 + [vocab // 2]] * 2),
                    torch.randint(0, vocab, (2, 13))):
            torch.testing.assert_close(m.execute([ids])[0], model(ids), rtol=0, atol=0)
    finally:
        prog.destroy()


def test_an_out_of_range_token_is_a_typed_error():
    from delegate.errors import InputError

    model = quantized_embedding(7, 64, 32)
    pm = lower(model, (torch.tensor([[1, 2]]),), device="cpu")
    prog = Runtime.get().load_program(pm.buffer, device="cpu")
    try:
        with pytest.raises(InputError, match="embedding index"):
            prog.load_method("forward").execute([torch.tensor([[1, 7]])])
    finally:
        prog.destroy()

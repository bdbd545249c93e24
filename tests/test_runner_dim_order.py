"""The runner runs dim_order_ops::_empty_dim_order.out, whose torch-side registration rejects
the memory_format it forwards to aten.empty.out (circular / reflect padding emits it)."""
import torch
import torch.nn.functional as F
from executorch.exir import to_edge

from delegate.runtime import Runtime


class CircularPad(torch.nn.Module):
    def forward(self, x):
        return F.pad(x, (2, 1), mode="circular") * 2


def test_empty_dim_order_out_runs_and_matches_eager():
    x = torch.randn(2, 3, 7)
    pte = to_edge(torch.export.export(CircularPad(), (x,))).to_executorch().buffer
    with Runtime.get().load_program(pte, device="cpu") as program:
        got = program.load_method("forward").execute([x])[0]
    torch.testing.assert_close(got, CircularPad()(x))

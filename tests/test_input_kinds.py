"""Every kind of tensor a user can pass: a dense CPU tensor of any strides runs and matches
eager (views, channels_last, broadcast-expanded); anything else (meta, sparse, quantized,
nested, another device) is an InputError saying a dense CPU tensor was expected. Through the
public API, on both executors and on the runner's non-delegated path."""
import warnings

import pytest
import torch
from executorch.exir import to_edge

from delegate.aot import lower
from delegate.errors import InputError
from delegate.runtime import Runtime


class _Pointwise(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0 + x


def _pte(rank: int, delegated: bool) -> bytes:
    x = torch.randn((1, 3, 4, 5)[4 - rank:])
    if delegated:
        return lower(_Pointwise(), (x,), device="webgpu").buffer
    return to_edge(torch.export.export(_Pointwise(), (x,))).to_executorch().buffer


FLOWS = [("cpu", True), ("webgpu", True), ("cpu", False)]   # (device, delegated)
IDS = ["cpu", "webgpu", "non-delegated"]


@pytest.fixture(scope="module", params=FLOWS, ids=IDS)
def methods(request):
    device, delegated = request.param
    progs = {r: Runtime.get().load_program(_pte(r, delegated), device=device) for r in (2, 4)}
    yield {r: p.load_method("forward") for r, p in progs.items()}
    for p in progs.values():
        p.destroy()


def _strided_inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 3, 5, 4, generator=g)
    wide = torch.randn(1, 3, 4, 10, generator=g)
    return {
        "contiguous": torch.randn(1, 3, 4, 5, generator=g),
        "transposed view": base.transpose(2, 3),
        "step-2 slice": wide[..., ::2],
        "channels_last": torch.randn(1, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
        "flipped": torch.randn(1, 3, 4, 5, generator=g).flip(-1),
        "expanded (stride 0)": torch.randn(1, 1, 4, 5, generator=g).expand(1, 3, 4, 5),
        "offset view": wide[..., 3:8],
    }


@pytest.mark.parametrize("kind", sorted(_strided_inputs()))
def test_dense_inputs_of_any_strides_match_eager(methods, kind):
    x = _strided_inputs()[kind]
    want = _Pointwise()(x.contiguous())
    (got,) = methods[4].execute([x])
    torch.testing.assert_close(got, want)


def _odd_inputs() -> dict:
    x = torch.randn(4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")    # beta / prototype / deprecation notices
        return {
            "meta": (torch.empty(4, 5, device="meta"), "on device meta"),
            "sparse COO": (x.to_sparse(), "sparse_coo tensor"),
            "sparse CSR": (x.to_sparse_csr(), "sparse_csr tensor"),
            "quantized": (torch.quantize_per_tensor(x, 0.1, 0, torch.quint8), "quantized"),
            "nested": (torch.nested.nested_tensor([x, x[:2]]), "nested tensor"),
            "jagged nested": (torch.nested.nested_tensor([x, x[:2]], layout=torch.jagged),
                              "nested tensor"),
        }


@pytest.mark.parametrize("kind", sorted(_odd_inputs()))
def test_non_dense_or_non_cpu_inputs_raise_input_error(methods, kind):
    x, what = _odd_inputs()[kind]
    with pytest.raises(InputError, match=f"input 0: expected a dense CPU torch.float32 tensor, "
                                         f"got .*{what}"):
        methods[2].execute([x])


def test_a_wrong_input_leaves_the_method_usable(methods):
    with pytest.raises(InputError):
        methods[2].execute([torch.empty(4, 5, device="meta")])
    x = torch.randn(4, 5)
    torch.testing.assert_close(methods[2].execute([x])[0], _Pointwise()(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to make a "
                    "tensor on another device (meta covers the same check here)")
def test_a_cuda_tensor_raises_input_error(methods):
    with pytest.raises(InputError, match="on device cuda"):
        methods[2].execute([torch.randn(4, 5, device="cuda")])

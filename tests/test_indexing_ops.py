"""index (advanced indexing) and index_select (delegate/ops/indexing.py): one node through each
executor against torch's own indexing of the same tensors, then programs through the
partitioner on both executors. A gather moves elements, so every check is exact: floats to
the bit. Shapes are prime-sized, with broadcast, negative, 0-d and int32 indices, and the
attention-mask gather transformers builds. WebGPU runs for real (lavapipe in CI).
"""
import pytest
import torch
from executorch.exir import to_edge
from torch import nn

from delegate.aot import lower, undelegated_ops
from delegate.errors import DelegateError, InputError
from delegate.ops import get_op
from delegate.ops._common import claiming_for
from delegate.ops.export import op_for_target
from tests.test_comparison_ops import check_exact
from tests.test_kernels_cpu import threads  # noqa: F401  (the pool-size fixture)
from tests.test_models import run_pte
from tests.test_nan_wgsl import nan_payloads, run_op
from tests.test_op_registry import _random_shapes

EXECUTORS = ["cpu", "webgpu"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def gather(executor, x, entries, wrap=True):
    """x[entries] through one index node (entries: index tensors or None)."""
    return run_op(executor, "index", [x, *entries], {"wrap": wrap}, out_dtype=x.dtype)[0]


def ints(low, high, *shape, dtype=torch.int64):
    return torch.randint(low, high, shape, dtype=dtype)


INDEXINGS = {   # case -> (x, entries): x[entries] in torch's terms
    "rows": (lambda: nan_payloads(7, 11, 5), lambda: [ints(-7, 7, 13)]),
    "middle_dim-int32": (lambda: nan_payloads(3, 11, 5),
                         lambda: [None, ints(-11, 11, 2, 3, dtype=torch.int32)]),
    "adjacent_pair-broadcast": (lambda: nan_payloads(7, 11, 5),
                                lambda: [ints(0, 7, 5, 1), ints(-11, 11, 1, 3)]),
    "split_pair-block_in_front": (lambda: nan_payloads(7, 3, 11),
                                  lambda: [ints(0, 7, 4, 1), None, ints(0, 11, 3)]),
    "0d_index": (lambda: nan_payloads(5, 13), lambda: [None, torch.tensor(-2)]),
    "int64_values": (lambda: ints(-2 ** 31, 2 ** 31 - 1, 29, 3), lambda: [ints(0, 29, 31)]),
    "bool_values": (lambda: torch.rand(3, 17) > 0.5, lambda: [None, ints(0, 17, 19)]),
    "every_dim": (lambda: nan_payloads(5, 7, 3),
                  lambda: [ints(0, 5, 11), ints(0, 7, 11), ints(0, 3, 11)]),
}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", sorted(INDEXINGS))
def test_index_gathers_what_torch_indexing_gathers(case, executor):
    make_x, make_entries = INDEXINGS[case]
    x, entries = make_x(), make_entries()
    check_exact(gather(executor, x, entries), x[tuple(slice(None) if e is None else e
                                                     for e in entries)])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("T", [2, 13, 32])
def test_index_builds_transformers_mask_operands(T, executor):
    """transformers' sdpa_mask: positions [1, T] gathered as [1, 1, T, 1] and [1, 1, 1, T] by
    a 4-d batch index and the query / key positions, one int64 index each."""
    positions = torch.arange(T).unsqueeze(0)
    batch = torch.zeros(1, 1, 1, 1, dtype=torch.int64)
    for kv in (torch.arange(T).view(1, 1, T, 1), torch.arange(T).view(1, 1, 1, T)):
        check_exact(gather(executor, positions, [batch, kv]), positions[batch, kv])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("wrap", [True, False], ids=["index", "index_select"])
def test_index_out_of_range_is_an_input_error_on_cpu_and_zero_on_webgpu(wrap, executor):
    """[-5, 5) is in range for index, [0, 5) for index_select (torch's refuses a negative)."""
    x, rows = nan_payloads(5, 3), torch.tensor([0, 5, -6 if wrap else -1, 4])
    low = -5 if wrap else 0
    if executor == "cpu":
        with pytest.raises(InputError, match=rf"index into dim 0: expected in \[{low}, 5\), got"):
            gather(executor, x, [rows], wrap)
        return
    got = gather(executor, x, [rows], wrap)
    check_exact(got[[0, 3]], x[[0, 4]])
    assert torch.equal(got[1:3].view(torch.int32), torch.zeros(2, 3, dtype=torch.int32))


def test_index_infer_refuses_indices_that_do_not_broadcast_or_outnumber_the_dims():
    with pytest.raises(DelegateError, match="broadcast"):
        get_op("index").infer([(5, 7), (3,), (4,)], {"wrap": True})
    with pytest.raises(DelegateError, match="at most rank 2"):
        get_op("index").infer([(5, 7), (3,), None, (3,)], {"wrap": True})
    with pytest.raises(DelegateError, match="at least one"):
        get_op("index").infer([(5, 7), None], {"wrap": True})


def test_index_infer_raises_only_delegate_errors_on_arbitrary_shapes():
    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        shapes = _random_shapes(gen, 1 + trial % 4)
        shapes[1:] = [None if len(s) == 4 else s for s in shapes[1:]]   # some None entries
        try:
            out = get_op("index").infer(shapes, {"wrap": True})
        except DelegateError as e:
            assert "expected" in str(e), str(e)
            continue
        assert all(isinstance(d, int) and d >= 0 for d in out[0]), (shapes, out)


def test_index_split_across_cpu_threads_along_each_kind_of_output_dim_0(threads,  # noqa: F811
                                                                         monkeypatch):
    """Output dim 0 is a dim of x, the index block's first, or (0-d indices) x's first kept."""
    import kernels_cpu.indexing

    monkeypatch.setattr(kernels_cpu.indexing, "PARALLEL_NUMEL", 8)   # split these small ones
    x = nan_payloads(13, 17, 19)
    for entries in ([ints(0, 13, 23)], [None, ints(0, 17, 29, 1), ints(0, 19, 7)],
                    [ints(0, 13, 3, 1), None, ints(0, 19, 1, 11)],
                    [torch.tensor(7), None, torch.tensor(-3)]):
        check_exact(gather("cpu", x, entries), x[tuple(slice(None) if e is None else e
                                                       for e in entries)])


# ---- what the partitioner claims --------------------------------------------------------------
def _edge_nodes(module, *args):
    ep = torch.export.export(module, args)
    graph = to_edge(ep).exported_program().graph
    return [n for n in graph.nodes if n.op == "call_function" and op_for_target(n.target)
            and op_for_target(n.target).name == "index"]


class Gathers(nn.Module):
    def forward(self, x, mask, i):
        return x[mask], x[i, i, i, i, i]


def test_check_refuses_a_bool_mask_and_more_index_tensors_than_webgpu_binds():
    mask_node, five_node = _edge_nodes(Gathers(), torch.randn(3, 3, 3, 3, 5),
                                       torch.rand(3, 3, 3, 3, 5) > 0.5, torch.tensor([0, 2]))
    check = get_op("index").check
    assert "bool mask" in check(mask_node) and "output size" in check(mask_node)
    assert check(five_node) is None
    with claiming_for("webgpu"):
        assert "at most 4" in check(five_node)


class Selects(nn.Module):
    """index_select along two dims and a reversal by a stepped arange, at a dynamic length."""

    def forward(self, x, rows):
        T = x.shape[1]
        backwards = torch.arange(T - 1, -1, -1)
        return (x.index_select(1, backwards), x.index_select(-1, rows),
                x[:, backwards, (rows - 11).to(torch.int32)])   # negative: from the end


@pytest.mark.parametrize("device", EXECUTORS)
def test_index_select_and_index_with_a_dynamic_length_match_eager(device):
    seq = torch.export.Dim("seq", min=2, max=32)
    pm = lower(Selects(), (torch.randn(2, 7, 11), ints(0, 11, 7)),
               dynamic_shapes=({1: seq}, {0: seq}), device=device)
    assert undelegated_ops(pm) == []
    inputs = [(torch.randn(2, t, 11), ints(0, 11, t)) for t in (2, 13, 32)]
    for args, got in zip(inputs, run_pte(pm, inputs, device)):
        for g, w in zip(got, Selects()(*args)):
            check_exact(g, w)

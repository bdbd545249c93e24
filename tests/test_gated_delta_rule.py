"""Gated delta rule: our CPU kernel against a float64 token-by-token reference, its argument
checks, and the op delegated end to end through the partitioner and the runner."""
from __future__ import annotations

import pytest
import torch

from delegate.errors import DelegateError
from delegate.ops.gated_delta_rule import gated_delta_rule
from kernels_cpu.threadpool import set_num_threads
from tests.tolerances import tol

RTOL = tol("gated_delta_rule")["rtol"]
SEQ_LENS = (1, 2, 31, 32, 33, 35, 130, 257)


def reference(q, k, v, decay, beta, s0):
    """The recurrence as written, one token at a time, in float64."""
    q, k, v, decay, beta, s = (t.double() for t in (q, k, v, decay, beta, s0))
    B, Hq, T, K = q.shape
    Hs = k.shape[1]
    if decay.dim() == 3:
        decay = decay.unsqueeze(-1).expand_as(k)
    out = torch.zeros(B, Hq, T, v.shape[-1], dtype=torch.float64)
    for t in range(T):
        s = s * decay[:, :, t, :, None]
        pred = torch.einsum("bhk,bhkv->bhv", k[:, :, t], s)
        delta = (v[:, :, t] - pred) * beta[:, :, t, None]
        s = s + k[:, :, t, :, None] * delta[:, :, None, :]
        qs = q[:, :, t].view(B, Hs, Hq // Hs, K)
        out[:, :, t] = torch.einsum("bhgk,bhkv->bhgv", qs, s).reshape(B, Hq, -1)
    return out, s


def make_inputs(T, B=2, Hq=2, Hs=2, K=5, V=6, scalar=False, decay="random", seed=0):
    g = torch.Generator().manual_seed(seed)
    dshape = (B, Hs, T) if scalar else (B, Hs, T, K)
    d = {
        "random": lambda: torch.rand(dshape, generator=g) * 0.998 + 0.001,
        "one": lambda: torch.ones(dshape),
        "tiny": lambda: torch.full(dshape, 1e-12),
        "zero": lambda: _with_zeros(torch.rand(dshape, generator=g)),
    }[decay]()
    return (
        torch.randn(B, Hq, T, K, generator=g),
        torch.randn(B, Hs, T, K, generator=g) / K ** 0.5,
        torch.randn(B, Hs, T, V, generator=g),
        d,
        torch.rand(B, Hs, T, generator=g),
        torch.randn(B, Hs, K, V, generator=g),
    )


def _with_zeros(d):
    d[:, :, d.shape[2] // 2] = 0.0          # an exact zero mid-sequence (mid-chunk too)
    d[:, :, -1] = 0.0
    return d


def assert_matches_reference(inputs):
    out, state = gated_delta_rule(*inputs)
    ref_out, ref_state = reference(*inputs)
    for name, got, want in (("out", out, ref_out), ("final_state", state, ref_state)):
        err = (got.double() - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
        assert err <= RTOL, f"{name}: relative error {err:.2e} > {RTOL}"


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    set_num_threads(request.param)
    yield request.param
    set_num_threads(1)


@pytest.mark.parametrize("T", SEQ_LENS)
@pytest.mark.parametrize("scalar", [False, True], ids=["channelwise", "scalar"])
def test_random_decay_matches_reference(T, scalar, threads):
    assert_matches_reference(make_inputs(T, scalar=scalar))


@pytest.mark.parametrize("T", SEQ_LENS)
def test_grouped_query_heads_share_state(T, threads):
    assert_matches_reference(make_inputs(T, Hq=4, Hs=2))


@pytest.mark.parametrize("T", SEQ_LENS)
@pytest.mark.parametrize("decay", ["one", "zero", "tiny"])
@pytest.mark.parametrize("scalar", [False, True], ids=["channelwise", "scalar"])
def test_extreme_decay_matches_reference(T, decay, scalar):
    assert_matches_reference(make_inputs(T, scalar=scalar, decay=decay))


@pytest.mark.parametrize("T", SEQ_LENS)
def test_beta_zero_keeps_decayed_state(T):
    q, k, v, d, beta, s0 = make_inputs(T)
    assert_matches_reference((q, k, v, d, torch.zeros_like(beta), s0))


@pytest.mark.parametrize("T", (1, 130))
def test_tiny_decay_in_one_chunk_only(T):
    """Decays of 1e-12 across one whole chunk, ordinary decays elsewhere."""
    q, k, v, d, beta, s0 = make_inputs(T)
    d[:, :, :32] = 1e-12
    assert_matches_reference((q, k, v, d, beta, s0))


def test_model_sized_heads_match_reference():
    assert_matches_reference(make_inputs(67, B=1, Hq=4, Hs=2, K=64, V=32))


@pytest.mark.parametrize("T", (1, 35))
def test_initial_state_is_not_written(T):
    inputs = make_inputs(T, Hq=4, Hs=2)
    before = inputs[-1].clone()
    gated_delta_rule(*inputs)
    assert torch.equal(inputs[-1], before)


# ---- argument checks ---------------------------------------------------------------------------
def _bad(index, value):
    args = list(make_inputs(4, Hq=4, Hs=2))
    args[index] = value(args[index])
    return args


@pytest.mark.parametrize("index, value, name", [
    (0, lambda t: t[0], "query"),                                  # rank 3
    (1, lambda t: t.double(), "key"),                              # dtype
    (2, lambda t: t[:, :, :3], "value"),                           # T mismatch
    (2, lambda t: t[..., :4], "initial_state"),                    # V mismatch vs state
    (3, lambda t: t[:, :, :3], "decay"),                           # decay of the wrong length
    (3, lambda t: t[..., :4], "decay"),                            # channelwise K mismatch
    (4, lambda t: t[:1], "beta"),                                  # B mismatch
    (5, lambda t: t[..., :4, :], "initial_state"),                 # K mismatch
    (0, lambda t: t[:, :3], "query"),                              # uneven head groups
])
def test_bad_arguments_raise_naming_the_argument(index, value, name):
    with pytest.raises(DelegateError, match=name):
        gated_delta_rule(*_bad(index, value))


# ---- delegated end to end ----------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
@pytest.mark.parametrize("op_name", ["gated_delta_rule", "channelwise_gated_delta_rule"])
@pytest.mark.parametrize("T", (1, 35))
def test_delegated_program_matches_reference(op_name, T, device):
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    from executorch.exir import to_edge_transform_and_lower

    from delegate import WgpuPartitioner
    from delegate.runtime.program import Runtime

    op = getattr(torch.ops.llama, op_name)

    class GatedDeltaNet(torch.nn.Module):
        def forward(self, q, k, v, decay, beta, state):
            out, final = op(q, k, v, decay, beta, state)
            return out, final

    inputs = tuple(make_inputs(T, B=1, Hq=4, Hs=2, K=8, V=8))
    ep = torch.export.export(GatedDeltaNet(), inputs)
    lowered = to_edge_transform_and_lower(ep, partitioner=[WgpuPartitioner(device=device)])
    graph = lowered.exported_program().graph_module.graph
    assert not any("gated_delta_rule" in str(n.target) for n in graph.nodes), \
        "the op was not delegated"
    pte = lowered.to_executorch().buffer
    method = Runtime.get().load_program(pte, device=device).load_method("forward")
    out, final = method.execute(list(inputs))
    ref_out, ref_state = reference(*inputs)
    rtol = tol("gated_delta_rule", device)["rtol"]
    torch.testing.assert_close(out.double(), ref_out, rtol=rtol, atol=rtol * ref_out.abs().max().item())
    torch.testing.assert_close(final.double(), ref_state, rtol=rtol,
                               atol=rtol * ref_state.abs().max().item())

"""Gated delta rule: ExecuTorch's `llama.gated_delta_rule` and its deprecated alias
`llama.channelwise_gated_delta_rule` (GatedDeltaNet / KDA linear attention).

    (q [B,Hq,T,K], k [B,Hs,T,K], v [B,Hs,T,V], decay [B,Hs,T,K] or [B,Hs,T], beta [B,Hs,T],
     initial_state [B,Hs,K,V]) -> (out [B,Hq,T,V], final_state [B,Hs,K,V])

Hq % Hs == 0: query heads s*G .. s*G+G-1 read state head s. Decay comes already exponentiated,
per key channel or one scalar per token. The op is functional: initial_state is never written.
The CPU kernel is kernels_cpu/gated_delta_rule.py.
"""
from __future__ import annotations

import torch

from delegate.errors import DelegateError, InputError, expect
from delegate.ops import register_op

ARG_NAMES = ("query", "key", "value", "decay", "beta", "initial_state")
_RANKS = {"query": (4,), "key": (4,), "value": (4,), "decay": (3, 4), "beta": (3,),
          "initial_state": (4,)}


def infer_shapes(in_shapes, attrs=None) -> list:
    """[out, final_state] shapes; raises DelegateError naming the first bad argument."""
    expect(len(in_shapes) == 6 and all(s is not None for s in in_shapes), DelegateError,
           "gated_delta_rule inputs", "6 tensors " + str(ARG_NAMES), in_shapes)
    shapes = dict(zip(ARG_NAMES, (tuple(_dim(d) for d in s) for s in in_shapes)))
    for name, ranks in _RANKS.items():
        expect(len(shapes[name]) in ranks, DelegateError, f"{name} rank",
               " or ".join(map(str, ranks)), f"{len(shapes[name])} (shape {shapes[name]})")
    B, Hq, T, K = shapes["query"]
    Hs = shapes["key"][1]
    V = shapes["value"][3]
    static = isinstance(Hq, int) and isinstance(Hs, int)
    expect(static and Hs > 0 and Hq % Hs == 0, DelegateError, "query heads",
           f"a multiple of key's {Hs} state heads", Hq)
    want = {
        "key": (B, Hs, T, K),
        "value": (B, Hs, T, V),
        "decay": (B, Hs, T, K) if len(shapes["decay"]) == 4 else (B, Hs, T),
        "beta": (B, Hs, T),
        "initial_state": (B, Hs, K, V),
    }
    for name, shape in want.items():
        expect(shapes[name] == shape, DelegateError, f"{name} shape", shape, shapes[name])
    return [(B, Hq, T, V), (B, Hs, K, V)]


def _dim(d):
    """An int, or the text of a symbolic size (export-time SymInt), so equal symbols compare
    equal without guarding."""
    return str(d.node.expr) if isinstance(d, torch.SymInt) else int(d)


def check_dtypes(dtypes) -> None:
    """Raise DelegateError naming the first argument that is not float32."""
    for name, dt in zip(ARG_NAMES, dtypes):
        expect(dt == torch.float32, DelegateError, f"{name} dtype", torch.float32, dt)


def _tensor_args(node) -> list:
    args = list(node.args[:6]) + [node.kwargs.get(n) for n in ARG_NAMES[len(node.args):]]
    return args


def _check(node):
    """Support rule for the partitioner: six float32 tensors with consistent shapes."""
    try:
        vals = [a.meta["val"] for a in _tensor_args(node)]
        check_dtypes([v.dtype for v in vals])
        infer_shapes([tuple(v.shape) for v in vals])
    except (DelegateError, AttributeError, KeyError, TypeError) as e:
        return f"gated_delta_rule: {e}"
    return None


def _lower(ctx, node) -> None:
    ins = [ctx.tensor(a) for a in _tensor_args(node)]
    ctx.emit("gated_delta_rule", ins, ctx.outputs(node))


register_op(
    "gated_delta_rule",
    targets=(
        "llama.gated_delta_rule.default",
        "llama.channelwise_gated_delta_rule.default",
    ),
    infer=infer_shapes,
    lower=_lower,
    check=_check,
    doc="GatedDeltaNet recurrence; T == 1 recurrent decode, T != 1 chunked WY prefill",
    attrs={},
    arity=(6, 2),
)


def gated_delta_rule(query, key, value, decay, beta, initial_state):
    """Eager entry for tests and benchmarks: validate as the registry does, allocate the
    outputs, run the CPU kernel. Returns (out, final_state)."""
    from kernels_cpu.gated_delta_rule import run_into

    ins = [query, key, value, decay, beta, initial_state]
    for name, t in zip(ARG_NAMES, ins):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name}: expected a tensor, got {type(t).__name__}")
    check_dtypes([t.dtype for t in ins])
    out_shape, state_shape = infer_shapes([tuple(t.shape) for t in ins])
    return run_into(ins, torch.empty(out_shape), torch.empty(state_shape))

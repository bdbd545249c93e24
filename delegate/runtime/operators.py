"""KernelCall → a precomputed Python closure over the method's value table.

Operators are resolved once at load: executorch prim ops run in Python (prim_ops.py); every
other name is looked up as `torch.ops.<namespace>.<name>.<overload>`. The emitter lays out a
KernelCall's args as one value per schema argument (out args included), followed by the
return value(s): the out args again for `.out` overloads, fresh values otherwise (a
multi-return op may put them in one TensorList).
"""
from __future__ import annotations

import importlib

import torch

from delegate.errors import ProgramError, UnknownOperatorError
from delegate.runtime.memory import DYNAMIC_BOUND
from delegate.runtime.prim_ops import prim_op

# Modules that register a namespace's operators (and their .out overloads) with torch.
_NAMESPACE_MODULES = {
    "dim_order_ops": ["executorch.exir.passes.dim_order_ops_registry"],
    "quantized_decomposed": ["torch.ao.quantization.fx._decomposed",
                             "executorch.kernels.quantized"],
    "llama": ["executorch.extension.llm.custom_ops.custom_ops"],
    "torchao": ["torchao.ops"],
}
_imported: set[str] = set()


def _register_namespace(ns: str) -> None:
    if ns in _imported:
        return
    _imported.add(ns)
    for module in _NAMESPACE_MODULES.get(ns, []):
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - an absent library just leaves its ops unknown
            pass


def resolve_aten(name: str, overload: str) -> torch._ops.OpOverload:
    """torch.ops overload for an ExecuTorch operator name ("aten::add", "out")."""
    qualified = f"{name}.{overload}" if overload else name
    if "::" not in name:
        raise UnknownOperatorError(
            f"operator name: expected 'namespace::name', got {qualified!r}")
    ns, op_name = name.split("::", 1)
    _register_namespace(ns)
    try:
        packet = getattr(getattr(torch.ops, ns), op_name)
        return getattr(packet, overload or "default")
    except Exception:  # noqa: BLE001 - torch raises AttributeError or RuntimeError here
        raise UnknownOperatorError(
            f"operator {qualified!r}: expected an op registered with torch "
            f"(ATen, dim_order_ops, quantized_decomposed, llama, executorch_prim), "
            f"got no such op") from None


def _empty_dim_order_out(size, *, dim_order=None, out):
    """torch's registration of this op forwards memory_format to aten.empty.out, which
    rejects it; the planner already laid `out` out in `dim_order`, so only a size can change."""
    if list(out.shape) != list(size):
        out.resize_(size)
    return out


# Ops whose torch-side `.out` registration cannot run as emitted; same schema, our body.
_REPLACEMENTS = {"dim_order_ops::_empty_dim_order.out": _empty_dim_order_out}


class Resolved:
    """One program operator, resolved once: a Python prim op or a torch OpOverload."""

    __slots__ = ("label", "prim", "op")

    def __init__(self, name: str, overload: str):
        self.label = f"{name}.{overload}" if overload else name
        self.prim = prim_op(self.label)
        self.op = None if self.prim is not None else resolve_aten(name, overload)


def kernel_writes(res: Resolved, args: list[int], table) -> set[int]:
    """Value indices a KernelCall writes (its out args, return values, mutated args)."""
    if res.prim is not None:
        return {args[-1] if res.prim[1] else args[0]} if args else set()
    schema = res.op._schema
    n = len(schema.arguments)
    out = set()
    for a, idx in zip(schema.arguments, args[:n]):
        if a.is_out or (a.alias_info is not None and a.alias_info.is_write):
            out.update(table.tensor_indices(idx))
    for idx in args[n:]:
        out.add(idx)
        out.update(table.tensor_indices(idx))
    return out


def build_kernel_call(res: Resolved, args: list[int], table):
    """closure(vals) running one KernelCall; `table` is the method's value table."""
    if res.prim is not None:
        return _prim_call(res.prim, args, table)
    return _aten_call(res.op, res.label, args, table)


def _prim_call(prim, args: list[int], table):
    fn, writes = prim
    if writes:
        getters = [table.getter(i) for i in args[:-1]]
        out = args[-1]
        store = table.replacer(out) if table.kind[out] == "tensor" else table.storer(out)

        def run(vals):
            store(vals, fn(*[g(vals) for g in getters]))
    else:
        getters = [table.getter(i) for i in args]

        def run(vals):
            fn(*[g(vals) for g in getters])
    return run


def _aten_call(op, label: str, args: list[int], table):
    schema = op._schema
    n = len(schema.arguments)
    if len(args) < n:
        raise ProgramError(
            f"{label} args: expected at least {n} (one per schema argument), got {len(args)}")
    pos, kw, outs = [], [], []
    for a, idx in zip(schema.arguments, args[:n]):
        g = table.getter(idx)
        (kw.append((a.name, g)) if a.kwarg_only else pos.append(g))
        if a.is_out:
            outs.extend(table.tensor_indices(idx))
    store = None if outs else _return_storer(label, schema, args[n:], table)
    inputs = {j for idx in args[:n] for j in table.tensor_indices(idx)} - set(outs)
    # A dynamic out is reset to zero elements so the kernel resizes it without torch's
    # "resized a non-empty output" warning; its capacity still bounds the result.
    reset = [i for i in outs if i not in inputs and table.dynamism(i) == DYNAMIC_BOUND]
    return _closure(_REPLACEMENTS.get(label, op), pos, kw, store, reset)


def _closure(op, pos, kw, store, reset):
    if not kw and store is None and not reset:
        def run(vals):
            op(*[g(vals) for g in pos])
        return run

    def run(vals):
        for i in reset:
            vals[i].resize_(0)
        res = op(*[g(vals) for g in pos], **{k: g(vals) for k, g in kw})
        if store is not None:
            store(vals, res)
    return run


def _return_storer(label: str, schema, rets: list[int], table):
    """Writes a functional op's result(s) into the trailing return values."""
    n_ret = len(schema.returns)
    if n_ret == 0:
        return None
    if len(rets) == 1 and n_ret == 1:
        return table.storer(rets[0])
    if len(rets) == 1 and table.kind[rets[0]] == "tensor_list":
        rets = table.items[rets[0]]
    if len(rets) != n_ret:
        raise ProgramError(
            f"{label} returns: expected {n_ret} return values, got {len(rets)}")
    storers = [table.storer(i) for i in rets]

    def store(vals, res):
        for s, r in zip(storers, res):
            s(vals, r)
    return store

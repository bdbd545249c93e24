"""LoweringContext: how an op's `lower(ctx, node)` turns an edge fx node into IR nodes.

Op declarations in delegate/ops call only these methods, so they never touch the graph
signature, the named-data store or the symbol table themselves.
"""
from __future__ import annotations

import math
import operator
from typing import Optional

import torch
import torch.fx

from delegate.errors import UnsupportedError
from delegate.integrity import weight_key
from delegate.ir import Graph, Node, ScalarValue, SymbolBinding, SymExpr, TensorValue

WEIGHT_ALIGNMENT = 16


def sym_text(x) -> "int | str":
    """An int stays an int; a SymInt becomes the text of its sympy expression."""
    if isinstance(x, torch.SymInt):
        expr = x.node.expr
        return int(expr) if expr.is_number else SymExpr(str(expr))
    return int(x)


class LoweringContext:
    def __init__(self, graph: Graph, upper_bounds: dict, named_data=None):
        self.graph = graph
        self._ids: dict = {}             # fx node -> value id (or list of ids for tuples)
        self._bounds = upper_bounds      # symbol name -> int upper bound
        self._named_data = named_data    # executorch NamedDataStore or None
        self._deferred: dict = {}        # constant placeholder -> tensor, bound on first use
        self._deferred_lowerings: dict = {}   # host-known node -> its lowering, run on first use
        self._producer: dict = {}        # value id -> name of the fx node it was made for
        self.weight_keys: list = []

    # ---- values --------------------------------------------------------------------------
    def tensor(self, arg) -> int:
        """Value id of a tensor argument: an fx node already lowered (or a getitem of one)."""
        if isinstance(arg, torch.fx.Node) and arg in self._deferred:
            self.bind_constant(arg, self._deferred.pop(arg))
        if isinstance(arg, torch.fx.Node) and arg in self._deferred_lowerings:
            self._deferred_lowerings.pop(arg)()
        if isinstance(arg, torch.fx.Node) and arg in self._ids:
            vid = self._ids[arg]
            if isinstance(vid, list):
                raise UnsupportedError(f"{arg.name}: expected a tensor, got a tuple of tensors")
            return vid
        if isinstance(arg, torch.fx.Node) and arg.target is operator.getitem:
            return self._ids[arg.args[0]][arg.args[1]]
        raise UnsupportedError(f"argument {arg!r}: expected a lowered tensor node, got none")

    def optional_tensor(self, arg) -> int:
        return -1 if arg is None else self.tensor(arg)

    def output(self, node: torch.fx.Node) -> int:
        """Create the value for a node's single tensor output from its meta['val']."""
        vid = self.graph.add_value(self._tensor_value(node.meta["val"]))
        self._ids[node] = vid
        self._producer[vid] = node.name
        return vid

    def outputs(self, node: torch.fx.Node) -> list:
        """Create one value per element of a tuple-valued node; getitem nodes map onto them."""
        ids = [self.graph.add_value(self._tensor_value(v)) for v in node.meta["val"]]
        self._ids[node] = ids
        self._producer.update((vid, node.name) for vid in ids)
        return ids

    def new_value(self, dtype: torch.dtype, dims: list) -> int:
        """An intermediate tensor a lowering adds between fx nodes (a broadcast source)."""
        dims = tuple(dims)
        return self.graph.add_value(TensorValue(dtype, dims, tuple(self.upper_bound(d) for d in dims)))

    def alias(self, node: torch.fx.Node, vid: int) -> None:
        """The node's result is an existing value (no kernel runs for it)."""
        self._ids[node] = vid

    def constant(self, tensor: torch.Tensor, name: str = "") -> int:
        """A weight: its bytes go to the named-data store keyed by their digest (checked at
        load, delegate/integrity.py), 16-byte aligned."""
        t = tensor.detach().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        key = weight_key(data, t.dtype, t.shape)
        if self._named_data is not None:
            self._named_data.add_named_data(key, data, alignment=WEIGHT_ALIGNMENT)
        self.weight_keys.append(key)
        shape = tuple(int(s) for s in t.shape)
        return self.graph.add_value(TensorValue(t.dtype, shape, shape, key))

    def bind_state(self, node: torch.fx.Node, tensor: torch.Tensor) -> int:
        """A mutable buffer the delegate owns (tag_mutated_buffer): its initial bytes go to
        the named-data store like a weight's; the executors copy them into a buffer of its own."""
        vid = self.constant(tensor, node.name)
        self.graph.values[vid].state = True
        self._ids[node] = vid
        return vid

    def writable(self, vid: int) -> bool:
        """May an in-place op overwrite this value (a state, or a node's output)?"""
        v = self.graph.values[vid]
        return isinstance(v, TensorValue) and (v.state or vid in self._producer)

    def bind_value_symbol(self, node: torch.fx.Node, source: torch.fx.Node, index: int) -> None:
        """`.item()` of element `index` of the delegate input `source`: the node's SymInt
        becomes a symbol bound from that element at execute (delegate/host_values.py)."""
        name = sym_text(node.meta["val"])
        vid = self.tensor(source)
        if not (isinstance(name, SymExpr) and name.isidentifier()) or vid not in self.graph.inputs:
            raise UnsupportedError(f"{node.name}: expected .item() of a delegate input as a "
                                   f"new symbol, got {name!r}")
        if all(b.name != name for b in self.graph.symbols):
            self.graph.symbols.append(SymbolBinding(name, self.graph.inputs.index(vid), -1 - index))

    def bind_constant(self, node: torch.fx.Node, tensor: torch.Tensor) -> int:
        vid = self.constant(tensor, node.name)
        self._ids[node] = vid
        return vid

    def defer_constant(self, node: torch.fx.Node, tensor: torch.Tensor) -> None:
        """A weight that enters the IR (and the named-data store) only if some lowering reads
        it through tensor(): one absorbed by a pattern (qdata a q4gsw linear repacks) never does."""
        self._deferred[node] = tensor

    def defer_lowering(self, node: torch.fx.Node, lower) -> None:
        """A node that lowers to nothing unless a kernel reads it as a tensor (a host-known
        range, delegate/host_values.py): `lower()` emits it at that first read."""
        self._deferred_lowerings[node] = lower

    def bind_input(self, node: torch.fx.Node) -> int:
        """A user input of the delegate: records which symbols its dims (or value) define."""
        val = node.meta["val"]
        idx = len(self.graph.inputs)
        bound = {b.name for b in self.graph.symbols}
        if isinstance(val, torch.SymInt):
            # A size computed outside the partition; dim -1 binds the symbol to its value.
            vid = self.graph.add_value(ScalarValue("int"))
            text = sym_text(val)
            if isinstance(text, SymExpr) and text.isidentifier() and text not in bound:
                self.graph.symbols.append(SymbolBinding(text, idx, -1))
            self._ids[node] = vid
            self.graph.inputs.append(vid)
            return vid
        vid = self.graph.add_value(self._tensor_value(val))
        self._ids[node] = vid
        self.graph.inputs.append(vid)
        for d, s in enumerate(val.shape):
            text = sym_text(s)
            if isinstance(text, str) and text.isidentifier() and text not in bound:
                self.graph.symbols.append(SymbolBinding(text, idx, d))
                bound.add(text)
        return vid

    # ---- sizes and nodes -----------------------------------------------------------------
    def dim(self, x) -> "int | str":
        """A size argument: an int, a SymInt, or an fx node producing a SymInt."""
        if isinstance(x, torch.fx.Node):
            x = x.meta["val"]
        return sym_text(x)

    def dims(self, xs) -> list:
        return [self.dim(x) for x in xs]

    def emit(self, op: str, inputs: list, outputs: list, **attrs) -> Node:
        """The IR node is named after the fx node its first output was made for."""
        name = self._producer.get(outputs[0], "") if outputs else ""
        n = Node(op, list(inputs), list(outputs), dict(attrs), name)
        self.graph.nodes.append(n)
        return n

    def upper_bound(self, d: "int | str") -> int:
        if not isinstance(d, SymExpr):
            return int(d)
        from delegate.symexpr import evaluate

        return evaluate(d, self._bounds)

    def _tensor_value(self, val) -> TensorValue:
        if not isinstance(val, torch.Tensor):
            raise UnsupportedError(f"value: expected a tensor, got {type(val).__name__}")
        dims = tuple(sym_text(s) for s in val.shape)
        return TensorValue(val.dtype, dims, tuple(self.upper_bound(d) for d in dims))


def constant_keys(ep) -> dict:
    """placeholder name -> state-dict / constants key, for parameters, buffers, constants."""
    sig = ep.graph_signature
    return {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
            **sig.inputs_to_lifted_tensor_constants}


def constant_inputs(ep, real: Optional[dict] = None) -> dict:
    """placeholder name -> tensor, for parameters, buffers and lifted constants.

    ExecuTorch hands a partitioner a program whose state dict holds FakeTensors; `real`
    (key -> tensor, from an earlier look at the real program) restores their values, and a
    FakeTensor left unresolved is omitted, so a check never reads a fake's data."""
    from torch._subclasses.fake_tensor import FakeTensor

    out = {}
    for name, key in constant_keys(ep).items():
        t = ep.state_dict[key] if key in ep.state_dict else ep.constants.get(key)
        if isinstance(t, FakeTensor) and real is not None and key in real:
            r = real[key]
            t = r if (r.shape, r.dtype) == (t.shape, t.dtype) else t
        if isinstance(t, FakeTensor) and isinstance(t.constant, torch.Tensor):
            t = t.constant   # a small constant edge lifted itself (the 1 of `x + 1`)
        if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor):
            out[name] = t
    return out


def upper_bounds(ep) -> dict:
    """symbol name -> upper bound (inf when unbounded) from the program's range constraints."""
    out = {}
    for sym, vr in ep.range_constraints.items():
        try:
            out[str(sym)] = int(vr.upper)
        except (TypeError, ValueError, OverflowError, AttributeError):   # sympy's oo, int_oo
            out[str(sym)] = math.inf
    return out


def simple_lower(op: str, tensor_args: tuple = (0,), attrs: Optional[dict] = None):
    """A lower() for the common shape: some positional tensor args, some scalar attributes.

    attrs maps attribute name -> (positional index or kwarg name, default).
    """
    attrs = attrs or {}

    def lower(ctx: LoweringContext, node: torch.fx.Node) -> None:
        ins = [ctx.optional_tensor(_arg(node, i, None)) for i in tensor_args]
        values = {k: _arg(node, where, default) for k, (where, default) in attrs.items()}
        ctx.emit(op, ins, [ctx.output(node)], **values)

    return lower


def _arg(node: torch.fx.Node, where, default):
    if isinstance(where, int):
        return node.args[where] if len(node.args) > where else default
    return node.kwargs.get(where, default)

"""Delegate blob (de)serialisation: ir.Graph <-> bytes, through schemas/delegate.fbs.

Layout: b"EWGB" | uint32 LE schema version | uint32 LE CRC32 of the FlatBuffer | FlatBuffer
with file_identifier "EWG1". decode() trusts nothing it reads: it checks magic, version and
CRC before parsing, then validates everything an executor relies on (value ids defined before
use, dims and their bounds, symbolic sizes, node arity and attributes against the op registry)
and raises BlobError saying what was expected and what came.
"""
from __future__ import annotations

import math
import struct
import zlib

import flatbuffers
import torch

from delegate import ops as registry
from delegate import symexpr
from delegate.errors import BlobError, UnknownOperatorError
from delegate.ir import (Check, Graph, ListValue, Node, ScalarValue, StateUpdate, SymbolBinding, SymExpr,
                         TensorValue, in_place_ok, last_reads)
from schemas.etwgpu_fb import AttrValue as AV
from schemas.etwgpu_fb import ValueKind as VK
from schemas.etwgpu_fb.Attribute import AttributeT
from schemas.etwgpu_fb.Bool import BoolT
from schemas.etwgpu_fb.BoolAttr import BoolAttrT
from schemas.etwgpu_fb.Check import CheckT
from schemas.etwgpu_fb.Dim import DimT
from schemas.etwgpu_fb.DType import DType
from schemas.etwgpu_fb.Float import FloatT
from schemas.etwgpu_fb.FloatAttr import FloatAttrT
from schemas.etwgpu_fb.FloatListAttr import FloatListAttrT
from schemas.etwgpu_fb.Graph import Graph as FbGraph
from schemas.etwgpu_fb.Graph import GraphT
from schemas.etwgpu_fb.Int import IntT
from schemas.etwgpu_fb.IntAttr import IntAttrT
from schemas.etwgpu_fb.IntListAttr import IntListAttrT
from schemas.etwgpu_fb.Node import NodeT
from schemas.etwgpu_fb.NoneAttr import NoneAttrT
from schemas.etwgpu_fb.StringAttr import StringAttrT
from schemas.etwgpu_fb.StateUpdate import StateUpdateT
from schemas.etwgpu_fb.Symbol import SymbolT
from schemas.etwgpu_fb.SymIntAttr import SymIntAttrT
from schemas.etwgpu_fb.Tensor import TensorT
from schemas.etwgpu_fb.Value import ValueT
from schemas.etwgpu_fb.ValueList import ValueListT

MAGIC = b"EWGB"
# 2: the header carries a CRC32 of the payload; Node.name. 3: delegate-owned state
# (Tensor.state, Graph.state_updates), value symbols (Symbol.dim < 0 on a tensor), runtime
# checks, sdpa's kv_len / causal_offset. Older blobs are refused with a re-export hint.
SCHEMA_VERSION = 3
FILE_IDENTIFIER = b"EWG1"
_PREFIX = struct.Struct("<4sI")      # magic, schema version: the same in every version
_HEADER = struct.Struct("<4sII")     # magic, schema version, CRC32 of the FlatBuffer
MAX_DIM = 2 ** 31 - 1                # one dim's bound; buffers are indexed with u32/i32
MAX_NUMEL = 2 ** 40                  # one tensor's elements (4 TiB of fp32): no real model

_DTYPES = {
    torch.float32: DType.float32, torch.float16: DType.float16, torch.bfloat16: DType.bfloat16,
    torch.float64: DType.float64, torch.int64: DType.int64, torch.int32: DType.int32,
    torch.int16: DType.int16, torch.int8: DType.int8, torch.uint8: DType.uint8,
    torch.bool: DType.bool,
}
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}


# ---- encode ----------------------------------------------------------------------------------
def encode(graph: Graph) -> bytes:
    g = GraphT()
    g.version = SCHEMA_VERSION
    g.values = [_value_t(v) for v in graph.values]
    g.nodes = [_node_t(n) for n in graph.nodes]
    g.inputs, g.outputs = list(graph.inputs), list(graph.outputs)
    g.symbols = [_symbol_t(s) for s in graph.symbols]
    g.stateUpdates = [_set(StateUpdateT(), state=u.state, value=u.value)
                      for u in graph.state_updates] or None
    g.checks = [_set(CheckT(), expr=c.expr, message=c.message) for c in graph.checks] or None
    b = flatbuffers.Builder(1024)
    b.Finish(g.Pack(b), file_identifier=FILE_IDENTIFIER)
    return frame(bytes(b.Output()))


def frame(payload: bytes) -> bytes:
    """The header (magic, version, CRC32 of payload) followed by the FlatBuffer payload."""
    return _HEADER.pack(MAGIC, SCHEMA_VERSION, zlib.crc32(payload)) + payload


def _value_t(v) -> ValueT:
    out = ValueT()
    if isinstance(v, TensorValue):
        t = TensorT()
        t.dtype = _DTYPES[v.dtype]
        t.dims = [_dim_t(d, m) for d, m in zip(v.dims, v.max_shape)]
        t.constantKey = v.constant_key
        t.state = v.state
        out.kindType, out.kind = VK.ValueKind.Tensor, t
    elif isinstance(v, ListValue):
        lst = ValueListT()
        lst.items = list(v.items)
        out.kindType, out.kind = VK.ValueKind.ValueList, lst
    else:
        cls, kind = {"int": (IntT, VK.ValueKind.Int), "float": (FloatT, VK.ValueKind.Float),
                     "bool": (BoolT, VK.ValueKind.Bool)}[v.kind]
        s = cls()
        s.v = v.value if v.value is not None else cls().v
        out.kindType, out.kind = kind, s
    return out


def _dim_t(d, m) -> DimT:
    t = DimT()
    t.max = int(m)
    if isinstance(d, SymExpr):
        t.expr = d
    else:
        t.size = int(d)
    return t


def _node_t(n: Node) -> NodeT:
    t = NodeT()
    t.op, t.inputs, t.outputs = n.op, list(n.inputs), list(n.outputs)
    t.attrs = [_attr_t(k, v) for k, v in n.attrs.items()]
    t.name = n.name or None
    return t


def _attr_t(name: str, v) -> AttributeT:
    a = AttributeT()
    a.name = name
    if v is None:
        a.valueType, a.value = AV.AttrValue.NoneAttr, NoneAttrT()
    elif isinstance(v, bool):
        a.valueType, a.value = AV.AttrValue.BoolAttr, _set(BoolAttrT(), v=v)
    elif isinstance(v, int):
        a.valueType, a.value = AV.AttrValue.IntAttr, _set(IntAttrT(), v=v)
    elif isinstance(v, float):
        a.valueType, a.value = AV.AttrValue.FloatAttr, _set(FloatAttrT(), v=v)
    elif isinstance(v, SymExpr):
        a.valueType, a.value = AV.AttrValue.SymIntAttr, _set(SymIntAttrT(), expr=v)
    elif isinstance(v, str):
        a.valueType, a.value = AV.AttrValue.StringAttr, _set(StringAttrT(), v=v)
    elif isinstance(v, (list, tuple)) and any(isinstance(e, float) for e in v):
        a.valueType, a.value = AV.AttrValue.FloatListAttr, _set(FloatListAttrT(), v=list(v))
    elif isinstance(v, (list, tuple)):
        ints = [0 if isinstance(e, SymExpr) else int(e) for e in v]
        exprs = [e if isinstance(e, SymExpr) else "" for e in v]
        t = _set(IntListAttrT(), v=ints, exprs=exprs if any(exprs) else None)
        a.valueType, a.value = AV.AttrValue.IntListAttr, t
    else:
        raise BlobError(f"attribute {name!r}: expected None/bool/int/float/str/list, got {v!r}")
    return a


def _set(obj, **fields):
    for k, v in fields.items():
        setattr(obj, k, v)
    return obj


def _symbol_t(s: SymbolBinding) -> SymbolT:
    return _set(SymbolT(), name=s.name, input=s.input, dim=s.dim)


# ---- decode ----------------------------------------------------------------------------------
def decode(blob: bytes) -> Graph:
    body = payload(bytes(blob))
    if not FbGraph.GraphBufferHasIdentifier(body, 0):
        raise BlobError(f"blob file identifier: expected {FILE_IDENTIFIER!r}, got {body[4:8]!r}")
    try:
        g = GraphT.InitFromPackedBuf(body, 0)
        graph = Graph(
            values=[_value(v) for v in (g.values or [])],
            nodes=[_node(n) for n in (g.nodes or [])],
            inputs=_ints(g.inputs),
            outputs=_ints(g.outputs),
            symbols=[SymbolBinding(_required(s.name, "symbol name"), int(s.input), int(s.dim))
                     for s in (g.symbols or [])],
            state_updates=[StateUpdate(int(u.state), int(u.value))
                           for u in (g.stateUpdates or [])],
            checks=[Check(SymExpr(_required(c.expr, "check expr")), _str(c.message or b""))
                    for c in (g.checks or [])],
        )
    except BlobError:
        raise
    except Exception as e:  # flatbuffers raises struct/index/unicode errors on garbage
        raise BlobError(f"blob body: expected a valid FlatBuffer Graph, got {type(e).__name__}: {e}") from e
    validate(graph)
    return graph


def payload(blob: bytes) -> bytes:
    """The FlatBuffer after a header whose magic, version and CRC32 all check out."""
    if len(blob) < _PREFIX.size:
        raise BlobError(f"blob: expected at least {_HEADER.size + 8} bytes, got {len(blob)}")
    magic, version = _PREFIX.unpack_from(blob)
    if magic != MAGIC:
        raise BlobError(f"blob magic: expected {MAGIC!r}, got {magic!r}")
    if 1 <= version < SCHEMA_VERSION:
        raise BlobError(f"blob schema version: expected {SCHEMA_VERSION}, got {version} (written "
                        "by an older etwgpu): re-export the model")
    if version != SCHEMA_VERSION:
        raise BlobError(f"blob schema version: expected {SCHEMA_VERSION}, got {version}")
    if len(blob) < _HEADER.size + 8:
        raise BlobError(f"blob: expected at least {_HEADER.size + 8} bytes, got {len(blob)}")
    crc = _HEADER.unpack_from(blob)[2]
    body = blob[_HEADER.size:]
    if zlib.crc32(body) != crc:
        raise BlobError(f"blob payload CRC32: expected {crc:#010x} (header), got "
                        f"{zlib.crc32(body):#010x} for {len(body)} bytes: the blob is corrupted")
    return body


def _ints(seq) -> list:
    """FlatBuffers' object API yields numpy arrays (or None); the IR holds Python ints."""
    return [] if seq is None else [int(x) for x in seq]


def _required(s, what: str) -> str:
    """A string the schema marks required: a mutated buffer can still leave it out."""
    if s is None:
        raise BlobError(f"{what}: expected a string, got none")
    return _str(s)


def _str(s) -> str:
    return s.decode() if isinstance(s, bytes) else s


def _value(v: ValueT):
    k = v.kind
    if v.kindType == VK.ValueKind.Tensor:
        if k.dtype not in _TORCH_DTYPES:
            raise BlobError(f"tensor dtype: expected one of {sorted(_TORCH_DTYPES)}, got {k.dtype}")
        dims = tuple(SymExpr(_str(d.expr)) if d.expr else int(d.size) for d in (k.dims or []))
        maxs = tuple(int(d.max) for d in (k.dims or []))
        key = _str(k.constantKey) if k.constantKey else None
        return TensorValue(_TORCH_DTYPES[k.dtype], dims, maxs, key, bool(k.state))
    if v.kindType == VK.ValueKind.ValueList:
        return ListValue(_ints(k.items))
    kinds = {VK.ValueKind.Int: "int", VK.ValueKind.Float: "float", VK.ValueKind.Bool: "bool"}
    if v.kindType not in kinds:
        raise BlobError(f"value kind: expected Tensor/Int/Float/Bool/ValueList, got {v.kindType}")
    return ScalarValue(kinds[v.kindType], k.v)


def _node(n: NodeT) -> Node:
    attrs = {}
    for a in n.attrs or []:
        name = _required(a.name, f"node {_str(n.op)!r} attribute name")
        if name in attrs:
            raise BlobError(f"node {_str(n.op)!r} attribute {name!r}: expected once, got twice")
        attrs[name] = _attr(a)
    op = _required(n.op, "node op")
    return Node(op, _ints(n.inputs), _ints(n.outputs), attrs, _str(n.name) or "")


def _attr(a: AttributeT):
    t, v = a.valueType, a.value
    if t == AV.AttrValue.NoneAttr:
        return None
    if t in (AV.AttrValue.IntAttr, AV.AttrValue.FloatAttr, AV.AttrValue.BoolAttr):
        return v.v
    if t == AV.AttrValue.StringAttr:
        return _str(v.v)
    if t == AV.AttrValue.SymIntAttr:
        return SymExpr(_str(v.expr))
    if t == AV.AttrValue.FloatListAttr:
        return [float(x) for x in (v.v if v.v is not None else [])]
    if t == AV.AttrValue.IntListAttr:
        ints = _ints(v.v)
        exprs = [_str(e) for e in (v.exprs or [])] or [""] * len(ints)
        return [SymExpr(e) if e else i for i, e in zip(ints, exprs)]
    raise BlobError(f"attribute {_str(a.name)!r}: expected a known attribute type, got {t}")


def validate(graph: Graph) -> None:
    """Everything an executor relies on: ids in range, every value defined before use and
    written once, dims non-negative and bounded, symbolic sizes over bound symbols only, and
    each node's arity and attributes as its op declares them. Raises BlobError."""
    n = len(graph.values)

    def check_id(vid, where):
        if not 0 <= vid < n:
            raise BlobError(f"{where}: expected a value id in [0, {n}), got {vid}")

    symbols = _check_symbols(graph, check_id)
    bounds = {s.name: graph.values[graph.inputs[s.input]].max_shape[s.dim]
              for s in graph.symbols if s.dim >= 0}
    for vid, v in enumerate(graph.values):
        _check_value(vid, v, symbols, bounds, check_id)
    defined = set(graph.inputs)
    defined.update(i for i, v in enumerate(graph.values)
                   if isinstance(v, TensorValue) and v.constant_key)
    for k, node in enumerate(graph.nodes):
        _check_node(k, node, graph, defined, symbols, check_id)
    for i, vid in enumerate(graph.outputs):
        check_id(vid, f"graph output {i}")
        if vid not in defined:
            raise BlobError(f"graph output {i}: expected a value a node, an input or a weight "
                            f"defines, got value {vid} that nothing defines")
    _check_state_updates(graph, defined, check_id)
    _check_in_place(graph)
    for i, c in enumerate(graph.checks):
        _check_expr(c.expr, symbols, f"check {i}")


def _check_in_place(graph: Graph) -> None:
    """An in-place op overwrites its input 0, so the executors give both values one buffer:
    that is sound only where ir.in_place_ok holds."""
    reads = last_reads(graph)
    for k, node in enumerate(graph.nodes):
        if _in_place(node.op) and not in_place_ok(graph, k, reads):
            raise BlobError(f"node {k} ({node.op}{' ' + node.name if node.name else ''}): "
                            f"expected input 0 a state or an earlier node's output of the "
                            f"output's dtype and shape that nothing reads later, got value "
                            f"{node.inputs[0] if node.inputs else None}")


def _in_place(op_name: str) -> bool:
    try:
        return registry.get_op(op_name).in_place
    except UnknownOperatorError:
        return False


def _check_state_updates(graph: Graph, defined: set, check_id) -> None:
    """Each update writes a state once, from a defined value of the state's dtype and shape."""
    seen = set()
    for i, u in enumerate(graph.state_updates):
        where = f"state update {i}"
        check_id(u.state, f"{where} state")
        check_id(u.value, f"{where} value")
        state, value = graph.values[u.state], graph.values[u.value]
        if not (isinstance(state, TensorValue) and state.state) or u.state in seen:
            raise BlobError(f"{where}: expected a state tensor updated once, got value {u.state} "
                            f"({_describe(state)})")
        seen.add(u.state)
        if u.value not in defined or not isinstance(value, TensorValue) or \
                (value.dtype, tuple(value.dims)) != (state.dtype, tuple(state.dims)):
            raise BlobError(f"{where}: expected a defined {state.dtype} value of shape "
                            f"{tuple(state.dims)}, got value {u.value} ({_describe(value)})")


def _check_symbols(graph: Graph, check_id) -> set:
    """The symbol names, each bound to a dim (or, dim -1, the value) of a graph input."""
    for i, vid in enumerate(graph.inputs):
        check_id(vid, f"graph input {i}")
        v = graph.values[vid]
        if isinstance(v, ListValue) or (isinstance(v, TensorValue) and v.constant_key):
            raise BlobError(f"graph input {i}: expected an activation tensor or a scalar, got "
                            f"value {vid} ({_describe(v)})")
    names = set()
    for s in graph.symbols:
        where = f"symbol {s.name!r}"
        if not s.name.isidentifier() or s.name in names:
            raise BlobError(f"{where}: expected a new identifier, got a bad or repeated name")
        if not 0 <= s.input < len(graph.inputs):
            raise BlobError(f"{where}: expected an input index < {len(graph.inputs)}, got {s.input}")
        v = graph.values[graph.inputs[s.input]]
        rank = len(v.dims) if isinstance(v, TensorValue) else 0
        if isinstance(v, ScalarValue):
            ok = s.dim == -1
        else:   # a dim, or (dim < 0) an element of a tensor of static shape
            ok = 0 <= s.dim < rank or (s.dim < 0 and not v.is_dynamic
                                         and s.element < math.prod(v.max_shape))
        if not ok:
            raise BlobError(f"{where}: expected a dim of input {s.input} ({_describe(v)}), "
                            f"got dim {s.dim}")
        names.add(s.name)
    return names


def _check_value(vid: int, v, symbols: set, bounds: dict, check_id) -> None:
    if isinstance(v, ListValue):
        for vid_item in v.items:
            check_id(vid_item, f"value {vid} (list) item")
        return
    if not isinstance(v, TensorValue):
        return
    where = f"value {vid} ({_describe(v)})"
    if len(v.dims) != len(v.max_shape):
        raise BlobError(f"{where}: expected a bound per dim, got {len(v.max_shape)} for "
                        f"{len(v.dims)} dims")
    for d, (size, bound) in enumerate(zip(v.dims, v.max_shape)):
        if not 0 <= bound <= MAX_DIM:
            raise BlobError(f"{where} dim {d} bound: expected within [0, {MAX_DIM}], got {bound}")
        if isinstance(size, SymExpr):
            if v.constant_key:   # weights and states alike
                raise BlobError(f"{where}: expected a weight of static shape, got dim {d} = {size}")
            _check_expr(size, symbols, f"{where} dim {d}")
            _check_bound(size, bound, bounds, f"{where} dim {d}")
        elif not 0 <= size <= bound:
            raise BlobError(f"{where} dim {d}: expected a size within [0, {bound}], got {size}")
    if v.state and (not v.constant_key or v.is_dynamic):
        raise BlobError(f"{where}: expected a state with initial data and a static shape")
    if math.prod(v.max_shape) >= MAX_NUMEL:
        raise BlobError(f"{where}: expected fewer than 2**40 elements, got "
                        f"{math.prod(v.max_shape)}")


def _check_expr(expr: SymExpr, symbols: set, where: str) -> None:
    unbound = symexpr.symbols_of(expr) - symbols   # also parses: BlobError on bad text
    if unbound:
        raise BlobError(f"{where}: expected an expression over {sorted(symbols)}, got "
                        f"{expr!r} using {sorted(unbound)}")


def _check_bound(expr: SymExpr, bound: int, bounds: dict, where: str) -> None:
    """A symbolic dim's bound holds its size at the symbols' bounds (as the lowering sized
    it), so a buffer sized for the bound never overflows; symbols bound to a scalar input
    carry no bound in the blob and are left to the executors' live checks."""
    if not symexpr.symbols_of(expr) <= set(bounds):
        return
    try:
        need = symexpr.evaluate(expr, bounds)
    except ArithmeticError as e:
        raise BlobError(f"{where}: expected a size {expr!r} defined at the symbols' bounds, "
                        f"got {type(e).__name__}") from None
    if bound < need:
        raise BlobError(f"{where} bound: expected at least {need} ({expr} at the symbols' "
                        f"bounds {bounds}), got {bound}")


def _check_node(k: int, node: Node, graph: Graph, defined: set, symbols: set, check_id) -> None:
    where = f"node {k} ({node.op}{' ' + node.name if node.name else ''})"
    for j, vid in enumerate(node.inputs):
        if vid == -1:
            continue
        check_id(vid, f"{where} input")
        v = graph.values[vid]
        items = v.items if isinstance(v, ListValue) else [vid]
        if not all(i in defined for i in items):
            raise BlobError(f"{where} input {j}: expected a value defined before use (a graph "
                            f"input, a weight or an earlier node's output), got value {vid}")
    for vid in node.outputs:
        check_id(vid, f"{where} output")
        v = graph.values[vid]
        if vid in defined:
            raise BlobError(f"{where} output: expected a value written once, got value {vid} "
                            f"({_describe(v)}) already defined")
        if not isinstance(v, TensorValue):
            raise BlobError(f"{where} output: expected a tensor value, got value {vid} "
                            f"({_describe(v)})")
        defined.add(vid)
    for name, value in node.attrs.items():
        for e in value if isinstance(value, list) else [value]:
            if isinstance(e, SymExpr):
                _check_expr(e, symbols, f"{where} attribute {name!r}")
    _check_declaration(where, node)


def _check_declaration(where: str, node: Node) -> None:
    """Arity and attributes as the op declares them; an op unknown here is left to the
    executor (UnknownOperatorError), an op declaring nothing (a third party's) to its kernel."""
    try:
        op = registry.get_op(node.op)
    except UnknownOperatorError:
        return
    why = registry.arity_mismatch(op, len(node.inputs), len(node.outputs))
    why = why or registry.attrs_mismatch(op, node.attrs)
    if why:
        raise BlobError(f"{where}: expected {why}")


def _describe(v) -> str:
    if isinstance(v, TensorValue):
        kind = " state" if v.state else " weight" if v.constant_key else ""
        return f"{v.dtype} tensor {tuple(v.dims)}{kind}"
    if isinstance(v, ListValue):
        return f"list of {len(v.items)}"
    return f"{v.kind} scalar"

"""Delegate blob (de)serialisation: ir.Graph <-> bytes, through schemas/delegate.fbs.

Layout: b"EWGB" | uint32 LE schema version | FlatBuffer with file_identifier "EWG1".
decode() validates everything an executor relies on (magic, version, identifier, value ids,
node arity) and raises BlobError saying what was expected and what came.
"""
from __future__ import annotations

import struct

import flatbuffers
import torch

from delegate.errors import BlobError
from delegate.ir import Graph, ListValue, Node, ScalarValue, SymbolBinding, SymExpr, TensorValue
from schemas.etwgpu_fb import AttrValue as AV
from schemas.etwgpu_fb import ValueKind as VK
from schemas.etwgpu_fb.Attribute import AttributeT
from schemas.etwgpu_fb.Bool import BoolT
from schemas.etwgpu_fb.BoolAttr import BoolAttrT
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
from schemas.etwgpu_fb.Symbol import SymbolT
from schemas.etwgpu_fb.SymIntAttr import SymIntAttrT
from schemas.etwgpu_fb.Tensor import TensorT
from schemas.etwgpu_fb.Value import ValueT
from schemas.etwgpu_fb.ValueList import ValueListT

MAGIC = b"EWGB"
SCHEMA_VERSION = 1
FILE_IDENTIFIER = b"EWG1"
_HEADER = struct.Struct("<4sI")

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
    b = flatbuffers.Builder(1024)
    b.Finish(g.Pack(b), file_identifier=FILE_IDENTIFIER)
    return _HEADER.pack(MAGIC, SCHEMA_VERSION) + bytes(b.Output())


def _value_t(v) -> ValueT:
    out = ValueT()
    if isinstance(v, TensorValue):
        t = TensorT()
        t.dtype = _DTYPES[v.dtype]
        t.dims = [_dim_t(d, m) for d, m in zip(v.dims, v.max_shape)]
        t.constantKey = v.constant_key
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
    blob = bytes(blob)
    if len(blob) < _HEADER.size + 8:
        raise BlobError(f"blob: expected at least {_HEADER.size + 8} bytes, got {len(blob)}")
    magic, version = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise BlobError(f"blob magic: expected {MAGIC!r}, got {magic!r}")
    if version != SCHEMA_VERSION:
        raise BlobError(f"blob schema version: expected {SCHEMA_VERSION}, got {version}")
    body = blob[_HEADER.size:]
    if not FbGraph.GraphBufferHasIdentifier(body, 0):
        raise BlobError(f"blob file identifier: expected {FILE_IDENTIFIER!r}, got {body[4:8]!r}")
    try:
        g = GraphT.InitFromPackedBuf(body, 0)
        graph = Graph(
            values=[_value(v) for v in (g.values or [])],
            nodes=[_node(n) for n in (g.nodes or [])],
            inputs=_ints(g.inputs),
            outputs=_ints(g.outputs),
            symbols=[SymbolBinding(_str(s.name), int(s.input), int(s.dim)) for s in (g.symbols or [])],
        )
    except BlobError:
        raise
    except Exception as e:  # flatbuffers raises struct/index/unicode errors on garbage
        raise BlobError(f"blob body: expected a valid FlatBuffer Graph, got {type(e).__name__}: {e}") from e
    validate(graph)
    return graph


def _ints(seq) -> list:
    """FlatBuffers' object API yields numpy arrays (or None); the IR holds Python ints."""
    return [] if seq is None else [int(x) for x in seq]


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
        return TensorValue(_TORCH_DTYPES[k.dtype], dims, maxs, key)
    if v.kindType == VK.ValueKind.ValueList:
        return ListValue(_ints(k.items))
    kinds = {VK.ValueKind.Int: "int", VK.ValueKind.Float: "float", VK.ValueKind.Bool: "bool"}
    if v.kindType not in kinds:
        raise BlobError(f"value kind: expected Tensor/Int/Float/Bool/ValueList, got {v.kindType}")
    return ScalarValue(kinds[v.kindType], k.v)


def _node(n: NodeT) -> Node:
    attrs = {_str(a.name): _attr(a) for a in (n.attrs or [])}
    return Node(_str(n.op), _ints(n.inputs), _ints(n.outputs), attrs)


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
    """Every id in range, every node input defined before use, graph I/O typed as expected."""
    n = len(graph.values)

    def check_id(vid, where):
        if not 0 <= vid < n:
            raise BlobError(f"{where}: expected a value id in [0, {n}), got {vid}")

    defined = set()
    for i, vid in enumerate(graph.inputs):
        check_id(vid, f"graph input {i}")
        defined.add(vid)
    defined.update(i for i, v in enumerate(graph.values)
                   if isinstance(v, TensorValue) and v.constant_key)
    for k, node in enumerate(graph.nodes):
        for vid in node.inputs:
            if vid != -1:
                check_id(vid, f"node {k} ({node.op}) input")
        for vid in node.outputs:
            check_id(vid, f"node {k} ({node.op}) output")
            defined.add(vid)
    for i, vid in enumerate(graph.outputs):
        check_id(vid, f"graph output {i}")
    for s in graph.symbols:
        if not 0 <= s.input < len(graph.inputs):
            raise BlobError(f"symbol {s.name}: expected an input index < {len(graph.inputs)}, got {s.input}")

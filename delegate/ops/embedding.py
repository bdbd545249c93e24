"""Embedding lookup: rows of a float32 weight [V, D] gathered by int32 or int64 indices.

embedding_q4gsw gathers rows of a torchao int4 weight-only embedding
(`IntxWeightOnlyConfig(int4, PerGroup(gs))` on nn.Embedding: a dequantize_affine feeding
aten.embedding) straight from the packed weights, in linear_q4gsw's layout (delegate/ops/q4gsw.py:
row v of packed int32 [V, D/8], scales [D/gs, V padded to 4]): 0.5 + 4/gs bytes per entry
instead of 4, and a tied LM head's packed weights are the same bytes, stored once.
"""
from __future__ import annotations

import torch

from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops._common import contiguous_inputs, one_input
from delegate.ops.export import register_pattern

_INDEX_DTYPES = (torch.int32, torch.int64)


def _infer_embedding(in_shapes, attrs):
    one_input(in_shapes, 2)
    weight, indices = in_shapes[0], in_shapes[1]
    expect(len(weight) == 2, DelegateError, "embedding weight rank", 2, len(weight))
    return [tuple(indices) + (weight[1],)]


def _lower_embedding(ctx, node):
    ctx.emit("embedding", [ctx.tensor(node.args[0]), ctx.tensor(node.args[1])], [ctx.output(node)])


def _check_embedding(node):
    weight, indices = node.args[0].meta["val"], node.args[1].meta["val"]
    if weight.dtype != torch.float32:
        return f"embedding weight: expected float32, got {weight.dtype}"
    if indices.dtype not in _INDEX_DTYPES:
        return f"embedding indices: expected int32 or int64, got {indices.dtype}"
    return contiguous_inputs(node)


register_op("embedding", ("aten.embedding.default",), _infer_embedding, _lower_embedding,
            check=_check_embedding, doc="out[..., :] = weight[indices[...], :]",
            attrs={}, arity=(2, 1))


def _infer_embedding_q4gsw(in_shapes, attrs):
    one_input(in_shapes, 3)
    v, d = attrs["V"], attrs["D"]
    expect(tuple(in_shapes[0]) == (v, d // 8), DelegateError, "embedding_q4gsw packed",
           (v, d // 8), tuple(in_shapes[0]))
    return [tuple(in_shapes[2]) + (d,)]


def _match_embedding_q4gsw(node):
    from delegate.ops.q4gsw import match_q4gsw_weight

    why = match_q4gsw_weight(node.args[0])
    if why is None and node.args[1].meta["val"].dtype not in _INDEX_DTYPES:
        why = f"indices: expected int32 or int64, got {node.args[1].meta['val'].dtype}"
    return why


def _lower_embedding_q4gsw(ctx, node):
    from delegate.ops.q4gsw import pack_q4gsw, q4gsw_weight

    qdata, scale, gs = q4gsw_weight(node, weight_arg=0)
    packed, scales = pack_q4gsw(qdata, scale, gs)
    v, d = qdata.shape
    ctx.emit("embedding_q4gsw", [ctx.constant(packed), ctx.constant(scales),
                                 ctx.tensor(node.args[1])], [ctx.output(node)],
             group_size=gs, D=int(d), V=int(v))


register_op("embedding_q4gsw", (), _infer_embedding_q4gsw, _lower_embedding_q4gsw,
            doc="rows of int4 group-symmetric weights, dequantized: q[v, d] * scale[d/gs, v]",
            attrs={"group_size": "int", "D": "int", "V": "int"}, arity=(3, 1))
register_pattern("embedding_q4gsw", "aten.embedding.default", _match_embedding_q4gsw,
                 _lower_embedding_q4gsw,
                 doc="torchao.dequantize_affine (int4, [1, gs], zero points 0) -> aten.embedding")

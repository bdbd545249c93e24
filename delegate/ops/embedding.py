"""Embedding lookup: rows of a float32 weight [V, D] gathered by int32 or int64 indices; and
embedding_bag (edge's aten._embedding_bag), the sum, mean or max of each bag of gathered rows.

embedding_bag: bag b holds indices[offsets[b] : offsets[b + 1]], the last bag running to the
end of indices. An index equal to `padding_idx` (-1: none) is left out of its bag, and of a
mean's count; an empty bag gives zeros. Only output 0 may be read (offset2bag, bag_size and
max_indices are training bookkeeping). Not claimed: per-sample weights, and
include_last_offset, whose last offset torch expects to be len(indices), a runtime value: where
it is not, torch's own kernels disagree (float32 sum stops there, max and float64 run to the
end, float32 mean sums to there and divides by the count to the end).

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
from delegate.ops._common import arg, contiguous_inputs, one_input, only_output0
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


EMBEDDING_BAG_MODES = ("sum", "mean", "max")   # aten._embedding_bag's mode 0, 1, 2


def _infer_embedding_bag(in_shapes, attrs):
    one_input(in_shapes, 3)
    weight, indices, offsets = (tuple(s) for s in in_shapes[:3])
    expect(len(weight) == 2, DelegateError, "embedding_bag weight rank", 2, len(weight))
    expect(len(indices) == 1 and len(offsets) == 1, DelegateError,
           "embedding_bag indices and offsets", "1-D", f"{indices} and {offsets}")
    expect(attrs["mode"] in EMBEDDING_BAG_MODES, DelegateError, "embedding_bag mode",
           EMBEDDING_BAG_MODES, attrs["mode"])
    return [(offsets[0], weight[1])]


def _check_embedding_bag(node):
    if only_output0(node) is None:
        return "outputs: expected only output 0 (the bags) read"
    weight, indices, offsets = (a.meta["val"] for a in node.args[:3])
    if weight.dtype != torch.float32:
        return f"embedding_bag weight: expected float32, got {weight.dtype}"
    if indices.dim() != 1 or offsets.dim() != 1:
        return f"embedding_bag indices, offsets: expected 1-D, got {indices.dim()}-D, " \
               f"{offsets.dim()}-D"
    for what, t in (("indices", indices), ("offsets", offsets)):
        if t.dtype not in _INDEX_DTYPES:
            return f"embedding_bag {what}: expected int32 or int64, got {t.dtype}"
    if arg(node, 6, "per_sample_weights") is not None:
        return "per_sample_weights: expected None"
    if arg(node, 7, "include_last_offset", False):
        return "include_last_offset: expected False (torch's kernels disagree on its last bag)"
    if arg(node, 4, "mode", 0) not in (0, 1, 2):
        return f"mode: expected 0, 1 or 2 (sum, mean, max), got {arg(node, 4, 'mode', 0)}"
    return contiguous_inputs(node)


def _lower_embedding_bag(ctx, node):
    padding = arg(node, 8, "padding_idx", -1)
    ctx.emit("embedding_bag", [ctx.tensor(a) for a in node.args[:3]],
             [ctx.output(only_output0(node))], mode=EMBEDDING_BAG_MODES[arg(node, 4, "mode", 0)],
             padding_idx=-1 if padding is None else int(padding))


register_op("embedding_bag", ("aten._embedding_bag.default",), _infer_embedding_bag,
            _lower_embedding_bag, dtypes=(torch.float32, torch.int64), check=_check_embedding_bag,
            doc="sum / mean / max of weight rows over each bag indices[offsets[b]:offsets[b+1]]",
            attrs={"mode": "str", "padding_idx": "int"},
            arity=(3, 1))


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

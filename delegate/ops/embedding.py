"""Embedding lookup: rows of a float32 weight [V, D] gathered by int32 or int64 indices."""
from __future__ import annotations

import torch

from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops._common import contiguous_inputs, one_input

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

"""Gathers by index tensors: index (advanced indexing, x[i], x[:, i, j]) and index_select.

index(x, [i_0, ..., i_{k-1}]) takes int32 or int64 index tensors, None for a dim taken whole
(k <= rank; dims past k are taken whole too). The index tensors broadcast to one shape B and

    out[a..., b..., c...] = x[a..., i_0[b], ..., i_{k-1}[b], c...]      (indexed dims adjacent)

where the dims of B stand at the first indexed dim when the indexed dims are adjacent, else in
front of every dim taken whole (numpy's rule: delegate.shape_math.index_block_start). A
negative index counts from the end of its dim, as in torch. index_select(x, dim, i) with a 1-D
i is index with i at dim `dim` and lowers as it, with attribute `wrap` false: torch's
index_select refuses a negative index. IR node: inputs [x, i_0, ..., i_{k-1}], -1 for a None
entry; attribute `wrap` (a negative index counts from the end).

An index outside [-size, size) of its dim ([0, size) without wrap) is bad input: the CPU
kernel raises InputError naming it; the WebGPU kernel, which cannot raise, writes 0 for that
element (bits 0: 0, 0.0, false) and reads nothing outside x. That is what embedding does with
an unknown token id.

A bool index (x[mask]) selects where the mask holds, so its output size depends on the mask's
values: export gives that size an unbacked symbol, which no delegate input binds, and the
check refuses every bool index, saying so. (Export gives none a static output shape; one that
had it would still need the mask's positions found on the device, which no kernel here does.)
"""
from __future__ import annotations

import torch

from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops._common import (FOUR_BYTE, arg, broadcast, claiming_device, four_byte_inputs,
                                  norm_dim, one_input)
from delegate.ops.export import target_name
from delegate.shape_math import index_block_start

INDEX_DTYPES = (torch.int32, torch.int64)


def _infer_index(in_shapes, attrs):
    one_input(in_shapes)
    x, indices = tuple(in_shapes[0]), list(in_shapes[1:])
    indexed = [d for d, s in enumerate(indices) if s is not None]
    expect(indexed, DelegateError, "index tensors", "at least one", "none")
    expect(len(indices) <= len(x), DelegateError, "index entries", f"at most rank {len(x)}",
           len(indices))
    block = broadcast(*(indices[d] for d in indexed))
    kept = [s for d, s in enumerate(x) if d not in indexed]
    at = index_block_start(indexed)
    return [tuple(kept[:at]) + tuple(block) + tuple(kept[at:])]


def _entries(node) -> list:
    """The index entries (fx nodes or None) of either target, one per leading dim of x."""
    if target_name(node.target) == "aten.index_select.default":
        rank = node.args[0].meta["val"].dim()
        return [None] * norm_dim(arg(node, 1, "dim", 0), rank) + [arg(node, 2, "index")]
    return list(node.args[1])


def _check_entry(j: int, entry) -> "str | None":
    val = entry.meta["val"]
    if val.dtype == torch.bool:
        return (f"index {j} ({entry.name}) is a bool mask: expected int32 or int64 indices; "
                f"a mask's output size depends on its values")
    if val.dtype not in INDEX_DTYPES:
        return f"index {j} ({entry.name}): expected int32 or int64, got {val.dtype}"
    return None


def _check_index(node):
    x = node.args[0].meta["val"]
    if x.dim() == 0:
        return "input: expected rank >= 1, got a 0-d tensor"
    if target_name(node.target) == "aten.index_select.default" and \
            arg(node, 2, "index").meta["val"].dim() != 1:
        return f"index: expected a 1-D tensor, got {arg(node, 2, 'index').meta['val'].dim()}-D"
    entries = _entries(node)
    given = [(j, e) for j, e in enumerate(entries) if e is not None]
    if not given or len(entries) > x.dim():
        return f"indices: expected 1 to {x.dim()} entries with a tensor, got {len(given)} of " \
               f"{len(entries)}"
    why = next(filter(None, (_check_entry(j, e) for j, e in given)), None)
    if why is None and claiming_device() == "webgpu":
        why = _webgpu_limit(len(given))
    return why or four_byte_inputs(node)


def _webgpu_limit(count: int) -> "str | None":
    """The WGSL kernel binds a fixed number of index tensors; a cpu blob takes any number."""
    from kernels_wgsl.indexing import MAX_INDICES

    if count > MAX_INDICES:
        return f"index tensors on webgpu: expected at most {MAX_INDICES}, got {count}"
    return None


def _lower_index(ctx, node):
    ins = [ctx.tensor(node.args[0])] + [ctx.optional_tensor(e) for e in _entries(node)]
    wrap = target_name(node.target) != "aten.index_select.default"
    ctx.emit("index", ins, [ctx.output(node)], wrap=wrap)


register_op("index", ("aten.index.Tensor", "aten.index_select.default"), _infer_index,
            _lower_index, dtypes=FOUR_BYTE, check=_check_index, attrs={"wrap": "bool"},
            arity=((2, None), 1),
            doc="x[i_0, ..., i_k] with broadcast int index tensors (None: a whole dim); "
                "index_select")

"""Shape ops: view, permute (and transpose / t), slice, select, cat, expand, unsqueeze,
squeeze, split and clone. Every one is a copy on CPU (edge has only the *_copy forms), and
moves any 4-byte dtype (float32, int32, int64, bool: a mask's or a position's shape too)
unconverted: cat's inputs share its result's dtype.
cast (`.to(dtype)`) and copy (`dst.copy_(src)`) are copies that convert dtypes.
slice_scatter writes rows at a host-known position: a KV cache's update.

The shape arithmetic every family shares lives in delegate/ops/_common.py.
"""
from __future__ import annotations

import torch

from delegate import host_values
from delegate.errors import DelegateError, UnsupportedError, expect
from delegate.ops import register_op
from delegate.ops.export import (constant_value, pattern_for, register_pattern,
                                 target_name, through_permutes)
from delegate.shape_math import slice_bounds
from delegate.ops._common import (FOUR_BYTE, arg, broadcast, contiguous_inputs,
                                  four_byte_inputs, norm_dim, numel, one_input)

CAST_DTYPES = {str(d).removeprefix("torch."): d for d in FOUR_BYTE}

# ---- view / expand -------------------------------------------------------------------------
def _infer_view(in_shapes, attrs):
    one_input(in_shapes)
    size, total = list(attrs["sizes"]), numel(in_shapes[0])
    holes = [i for i, s in enumerate(size) if s == -1]
    expect(len(holes) <= 1, DelegateError, "view sizes", "at most one -1", size)
    known = numel(s for s in size if s != -1)
    if holes:
        expect(known > 0 and total % known == 0, DelegateError, "view sizes",
               f"a shape compatible with {total} elements", size)
        size[holes[0]] = total // known
    expect(numel(size) == total, DelegateError, "view numel", total, f"{numel(size)} for {size}")
    return [tuple(size)]


def _lower_view(ctx, node):
    ctx.emit("view", [ctx.tensor(node.args[0])], [ctx.output(node)], sizes=ctx.dims(node.args[1]))


def _infer_expand(in_shapes, attrs):
    one_input(in_shapes)
    src, size = tuple(in_shapes[0]), list(attrs["sizes"])
    expect(len(size) >= len(src), DelegateError, "expand rank", f">= {len(src)}", len(size))
    lead = len(size) - len(src)
    for i, s in enumerate(src):
        want = size[lead + i]
        if want == -1:
            size[lead + i] = s
        else:
            expect(s in (1, want), DelegateError, f"expand dim {lead + i}", f"{s} or from 1", want)
    expect(all(s >= 0 for s in size[:lead]), DelegateError, "expand new dims", ">= 0", size[:lead])
    return [tuple(size)]


def _lower_expand(ctx, node):
    ctx.emit("expand", [ctx.tensor(node.args[0])], [ctx.output(node)],
             sizes=ctx.dims(node.args[1]))


# ---- permute / transpose / t ------------------------------------------------------------------
def _infer_permute(in_shapes, attrs):
    one_input(in_shapes)
    src, dims = in_shapes[0], attrs["dims"]
    expect(sorted(norm_dim(d, len(src)) for d in dims) == list(range(len(src))), DelegateError,
           "permute dims", f"a permutation of {len(src)} dims", dims)
    return [tuple(src[norm_dim(d, len(src))] for d in dims)]


def _lower_permute(ctx, node):
    rank = node.args[0].meta["val"].dim()
    name = target_name(node.target)
    if name == "aten.transpose_copy.int":
        a, b = (norm_dim(d, rank) for d in node.args[1:3])
        dims = list(range(rank))
        dims[a], dims[b] = b, a
    elif name == "aten.t_copy.default":
        dims = list(range(rank))[::-1]  # t() of a 1-D tensor is the identity
    else:
        dims = [norm_dim(d, rank) for d in node.args[1]]
    ctx.emit("permute", [ctx.tensor(node.args[0])], [ctx.output(node)], dims=dims)


# ---- slice / select ----------------------------------------------------------------------------
def _infer_slice(in_shapes, attrs):
    one_input(in_shapes)
    src = list(in_shapes[0])
    d = norm_dim(attrs["dim"], len(src))
    expect(attrs["step"] >= 1, DelegateError, "slice step", ">= 1", attrs["step"])
    start, end, step = slice_bounds(src[d], attrs["start"], attrs["end"], attrs["step"])
    src[d] = (end - start + step - 1) // step
    return [tuple(src)]


def _size_arg(ctx, x):
    return None if x is None else ctx.dim(x)


def _lower_slice(ctx, node):
    rank = node.args[0].meta["val"].dim()
    ctx.emit("slice", [ctx.tensor(node.args[0])], [ctx.output(node)],
             dim=norm_dim(arg(node, 1, "dim", 0), rank),
             start=_size_arg(ctx, arg(node, 2, "start")), end=_size_arg(ctx, arg(node, 3, "end")),
             step=int(arg(node, 4, "step", 1)))


def _infer_select(in_shapes, attrs):
    one_input(in_shapes)
    src = list(in_shapes[0])
    d = norm_dim(attrs["dim"], len(src))
    i = attrs["index"]
    expect(-src[d] <= i < src[d], DelegateError, "select index", f"in [{-src[d]}, {src[d]})", i)
    return [tuple(src[:d] + src[d + 1:])]


def _lower_select(ctx, node):
    rank = node.args[0].meta["val"].dim()
    ctx.emit("select", [ctx.tensor(node.args[0])], [ctx.output(node)],
             dim=norm_dim(node.args[1], rank), index=ctx.dim(node.args[2]))


# ---- slice_scatter: rows written at a host-known position (a KV cache update) -------------
# out = dst with out.narrow(dim, start, src.size(dim)) = src, where src is input 1 read through
# the permutation src_dims (empty: as it is), so a transposed k is written without a copy of
# its own. The in-place twin
# `slice_scatter_` writes only those rows into dst's own buffer; the lowering emits it
# wherever nothing reads dst afterwards (ir.in_place_ok), so a decode step writes one row of
# the cache instead of copying all of it. Edge forms: `cache[:, :, pos + arange(T)] = v`
# (index_put with a host Range, delegate/host_values.py), index_copy, slice_scatter.
_SCATTER_TARGETS = ("aten.index_put.default", "aten.index_copy.default",
                    "aten.slice_scatter.default")


def _infer_slice_scatter(in_shapes, attrs):
    one_input(in_shapes, 2)
    dst, src = tuple(in_shapes[0]), tuple(in_shapes[1])
    perm = attrs.get("src_dims") or list(range(len(src)))
    expect(sorted(perm) == list(range(len(src))), DelegateError, "slice_scatter src_dims",
           f"a permutation of {len(src)} dims", perm)
    src = tuple(src[i] for i in perm)   # the source as written: its input read through the permute
    d = norm_dim(attrs["dim"], len(dst))
    same = len(src) == len(dst) and all(a == b for i, (a, b) in enumerate(zip(src, dst)) if i != d)
    expect(same, DelegateError, "slice_scatter source shape", f"{dst} except dim {d}", src)
    start = attrs["start"]
    expect(0 <= start and start + src[d] <= dst[d], DelegateError, "slice_scatter rows",
           f"[start, start + {src[d]}) within [0, {dst[d]}) of dim {d}", f"start {start}")
    return [dst]


def _scatter_args(node):
    """(dst, src, dim, start expr) of a host-positioned write, or None."""
    name = target_name(node.target)
    if name == "aten.index_put.default":
        dst, indices, src = node.args[:3]
        if arg(node, 3, "accumulate", False):
            return None
        given = [i for i, x in enumerate(indices) if x is not None]
        if len(given) != 1:
            return None
        dim, index = given[0], indices[given[0]]
    elif name == "aten.index_copy.default":
        dst, dim, index, src = node.args[:4]
    else:   # aten.slice_scatter.default(dst, src, dim=0, start=None, end=None, step=1)
        dst, src = node.args[:2]
        dim, step = arg(node, 2, "dim", 0), arg(node, 5, "step", 1)
        start = host_values.expr_of(arg(node, 3, "start", None) or 0)
        return None if step != 1 or start is None else (dst, src, dim, start)
    rows = host_values.value_of(index) if isinstance(index, torch.fx.Node) else None
    if not isinstance(rows, host_values.Range):
        return None
    return dst, src, dim, rows.start


def _check_slice_scatter(node):
    found = _scatter_args(node)
    if found is None:
        return "expected a write of consecutive rows at a host-known position"
    dst, src, dim, _ = found
    dv, sv = dst.meta["val"], src.meta["val"]
    d = norm_dim(dim, dv.dim())
    want = _written_shape(node, dv, d)
    lead = len(want) - sv.dim()
    fits = lead >= 0 and all(str(s) in ("1", str(w)) for s, w in zip(sv.shape, want[lead:]))
    if not fits or (lead and not all(str(w) == "1" for w in want[:lead])):
        return f"source shape {tuple(sv.shape)}: expected {tuple(want)} or broadcast to it"
    if sv.dtype != dv.dtype or dv.dtype not in FOUR_BYTE:
        return f"dtypes {dv.dtype} / {sv.dtype}: expected one of {FOUR_BYTE}, equal"
    return contiguous_inputs(node)


def _written_shape(node, dst_val, d) -> list:
    """The rows the write covers: dst's shape with dim d the source's (index_put: the
    range's) length."""
    found = _scatter_args(node)
    shape = list(dst_val.shape)
    if target_name(node.target) == "aten.slice_scatter.default":
        shape[d] = found[1].meta["val"].shape[d]
    else:
        index = node.args[1][d] if target_name(node.target) == "aten.index_put.default" \
            else node.args[2]
        shape[d] = index.meta["val"].shape[0]
    return shape


def _lower_slice_scatter(ctx, node):
    written = write_inputs(ctx, node)
    _emit_write(ctx, *written, ctx.output(node))


def _emit_write(ctx, dst: int, src: int, dim: int, start, perm: list, out: int) -> None:
    # in place optimistically; preprocess demotes it where dst is read later (ir.in_place_ok)
    op = "slice_scatter_" if ctx.writable(dst) else "slice_scatter"
    ctx.emit(op, [dst, src], [out], dim=dim, start=start, src_dims=perm)


def write_inputs(ctx, node) -> tuple:
    """(dst id, src id, dim, start, src_dims) of a cache write of either edge form, made as its
    own lowering makes them (a broadcast source's expand emitted); the write is the caller's."""
    dst, d, start = write_target(ctx, node)
    if write_broadcasts(node):   # index_put broadcasts its values
        cache, src = _scatter_args(node)[:2]
        written = _written_shape(node, cache.meta["val"], d)
        full = ctx.new_value(src.meta["val"].dtype, ctx.dims(written))
        ctx.emit("expand", [ctx.tensor(src)], [full], sizes=ctx.dims(written))
        return dst, full, d, start, []
    src, perm = write_source(node)
    return dst, ctx.tensor(src), d, start, perm


def write_target(ctx, node) -> tuple:
    """(dst id, dim, start) of a cache write of either edge form."""
    if target_name(node.target) not in _SCATTER_TARGETS:   # llama.update_cache
        _, cache, start = _update_cache_args(node)
        return ctx.tensor(cache), 1, start
    dst, _, dim, start = _scatter_args(node)
    return ctx.tensor(dst), norm_dim(dim, dst.meta["val"].dim()), start


def write_source(node) -> tuple:
    """(the fx node whose value a cache write copies, the permutation it reads it through: []
    as it is), where the write does not broadcast it: the custom cache's transposes there and
    back (through_permutes), or k.transpose(1, 2) into the cache, one strided copy."""
    if target_name(node.target) not in _SCATTER_TARGETS:   # llama.update_cache
        return through_permutes(_update_cache_args(node)[0])
    src = _scatter_args(node)[1]
    if _only_permute_of(src, node):
        return src.args[0], [int(i) for i in src.args[1]]
    return src, []


def write_broadcasts(node) -> bool:
    """The cache write's source is broadcast to the written rows (index_put's values)."""
    if target_name(node.target) not in _SCATTER_TARGETS:
        return False
    dst, src, dim, _ = _scatter_args(node)
    d = norm_dim(dim, dst.meta["val"].dim())
    return [str(s) for s in src.meta["val"].shape] != \
        [str(s) for s in _written_shape(node, dst.meta["val"], d)]


def cache_write(node) -> "tuple | None":
    """(dst node, dim, start, rows) of a node whose lowering is one slice_scatter(_) into dst
    (either edge form; rows: the written extent along dim), else None: a graph pass's test."""
    pattern = pattern_for(node)
    if pattern is not None:
        found = _update_cache_args(node) if pattern.lower is _lower_update_cache else None
        return None if found is None else (found[1], 1, found[2], found[0].meta["val"].shape[1])
    if getattr(node, "op", None) != "call_function" or \
            target_name(node.target) not in _SCATTER_TARGETS or _scatter_args(node) is None:
        return None
    dst, _, dim, start = _scatter_args(node)
    d = norm_dim(dim, dst.meta["val"].dim())
    return dst, d, start, _written_shape(node, dst.meta["val"], d)[d]


# ---- slice_scatter_pair: a layer's two cache writes in one node ---------------------------------
# slice_scatter_pair(dst, src, dst1, src1) -> dst' is slice_scatter_(dst, src) and
# slice_scatter_(dst1, src1) at one dim and start (src_dims and src_dims1 their source
# permutations; the shapes may differ, K and V head dims). Output 0 is dst updated in place
# (OpDef.in_place); dst1's rows are written in place too, and its later readers read dst1
# itself (the executors alias only output 0), so the cache_write pass
# (delegate/passes/cache_write.py), its only emitter, pairs states nothing else reads.
def infer_slice_scatter_pair(in_shapes, attrs):
    one_input(in_shapes, 4)
    _infer_slice_scatter(in_shapes[2:4], {**attrs, "src_dims": attrs["src_dims1"]})
    return _infer_slice_scatter(in_shapes[:2], attrs)


def _lower_slice_scatter_pair(ctx, node):
    # unreachable through the registry (no targets); says so if a plugin routes a node here
    raise UnsupportedError(f"node {node.name}: expected slice_scatter_pair only from the "
                           f"cache_write pass (delegate/passes/cache_write.py), got an edge node "
                           f"lowered as it")


def _only_permute_of(src, user) -> bool:
    """src is a permute_copy that only this write reads."""
    return (getattr(src, "op", None) == "call_function" and list(src.users) == [user]
            and target_name(src.target) == "aten.permute_copy.default")


# ---- cat / split -------------------------------------------------------------------------------
def _infer_cat(in_shapes, attrs):
    # torch still skips legacy empty 1-D inputs of shape (0,) next to higher-rank ones
    shapes = [tuple(s) for s in in_shapes if s is not None and tuple(s) != (0,)] or [(0,)]
    ref = shapes[0]
    d = norm_dim(attrs["dim"], len(ref))
    for s in shapes[1:]:
        same = len(s) == len(ref) and all(a == b for i, (a, b) in enumerate(zip(s, ref)) if i != d)
        expect(same, DelegateError, "cat shapes", f"{ref} except dim {d}", s)
    return [ref[:d] + (sum(s[d] for s in shapes),) + ref[d + 1:]]


def _check_cat(node):
    dtypes = {t.meta["val"].dtype for t in node.args[0] if isinstance(t, torch.fx.Node)}
    if dtypes - {node.meta["val"].dtype}:
        return (f"input dtypes {sorted(map(str, dtypes))}: expected all "
                f"{node.meta['val'].dtype} (no promotion)")
    return four_byte_inputs(node)


def _lower_cat(ctx, node):
    tensors = node.args[0]
    rank = node.meta["val"].dim()
    ctx.emit("cat", [ctx.tensor(t) for t in tensors], [ctx.output(node)],
             dim=norm_dim(arg(node, 1, "dim", 0), rank))


def _infer_split(in_shapes, attrs):
    one_input(in_shapes)
    src = tuple(in_shapes[0])
    d = norm_dim(attrs["dim"], len(src))
    sizes = attrs["split_sizes"]
    expect(sum(sizes) == src[d] and min(sizes, default=0) >= 0, DelegateError, "split sizes",
           f"non-negative sizes summing to {src[d]}", sizes)
    return [src[:d] + (s,) + src[d + 1:] for s in sizes]


def _lower_split(ctx, node):
    rank = node.args[0].meta["val"].dim()
    ctx.emit("split", [ctx.tensor(node.args[0])], ctx.outputs(node),
             split_sizes=ctx.dims(node.args[1]), dim=norm_dim(arg(node, 2, "dim", 0), rank))


# ---- unsqueeze / squeeze / clone ---------------------------------------------------------------
def _infer_unsqueeze(in_shapes, attrs):
    one_input(in_shapes)
    src = list(in_shapes[0])
    d = norm_dim(attrs["dim"], len(src) + 1)
    return [tuple(src[:d] + [1] + src[d:])]


def _lower_unsqueeze(ctx, node):
    rank = node.args[0].meta["val"].dim()
    ctx.emit("unsqueeze", [ctx.tensor(node.args[0])], [ctx.output(node)],
             dim=norm_dim(node.args[1], rank + 1))


def _infer_squeeze(in_shapes, attrs):
    one_input(in_shapes)
    src = in_shapes[0]
    dims = {norm_dim(d, len(src), "squeeze dim", scalar_ok=True) for d in attrs["dims"]}
    # torch: squeezing a dim whose size is not 1 leaves it in place
    return [tuple(s for i, s in enumerate(src) if not (i in dims and s == 1))]


def _lower_squeeze(ctx, node):
    val = node.args[0].meta["val"]
    dims = arg(node, 1, "dim", None)
    dims = range(val.dim()) if dims is None else [dims] if isinstance(dims, int) else dims
    # only dims that are statically 1 squeeze, so a dynamic dim never changes the rank at run time
    dims = {norm_dim(d, val.dim()) for d in dims} if val.dim() else set()
    keep = sorted(d for d in dims if isinstance(val.shape[d], int) and val.shape[d] == 1)
    ctx.emit("squeeze", [ctx.tensor(node.args[0])], [ctx.output(node)], dims=keep)


def _layout_reason(node) -> "str | None":
    """Why a copy's requested layout is not the contiguous one our buffers hold, else None."""
    order = node.kwargs.get("dim_order")
    rank = node.meta["val"].dim()
    if order is not None and list(order) != list(range(rank)):
        return f"dim_order: expected contiguous {list(range(rank))}, got {list(order)}"
    mf = node.kwargs.get("memory_format")
    if mf not in (None, torch.contiguous_format, torch.preserve_format):
        return f"memory_format: expected contiguous, got {mf}"
    return None


def _check_copy_of(dtypes_reason):
    """A clone's or cast's check: the layout, then its dtypes unless it copies a weight."""
    def check(node):
        if _constant_source(node) is not None:
            return _layout_reason(node)   # folded into a new constant at lowering, any dtypes
        return _layout_reason(node) or dtypes_reason(node)

    return check


def _constant_source(node):
    """The weight a copy/cast reads, when it reads one (`x + 1` casts a lifted int64 1)."""
    src = node.args[0] if node.args else None
    return constant_value(src) if isinstance(src, torch.fx.Node) else None


def _same_shape(in_shapes, attrs):
    one_input(in_shapes)
    return [tuple(in_shapes[0])]


def _folded_constant(ctx, node) -> bool:
    """A copy or cast of a weight becomes a new weight: no kernel, inside the delegate or out."""
    const = _constant_source(node)
    if const is not None:
        ctx.alias(node, ctx.constant(const.to(node.meta["val"].dtype)))
    return const is not None


def _lower_clone(ctx, node):
    if not _folded_constant(ctx, node):
        ctx.emit("clone", [ctx.tensor(node.args[0])], [ctx.output(node)])


# ---- cast / copy: copies that convert ---------------------------------------------------------
# cast: `.to(dtype)` (edge's _to_dim_order_copy), out = x converted to attribute `dtype`, as
# torch converts: bool -> 0 / 1, to bool x != 0 (NaN is true), float -> int truncates.
# copy: the functional form of `dst.copy_(src)` (a DeltaNet state write), out = src broadcast
# to dst's shape and converted to dst's dtype; dst's values are not read. Where src already
# has dst's shape and dtype it is the result itself and no kernel runs.
def _infer_cast(in_shapes, attrs):
    expect(attrs["dtype"] in CAST_DTYPES, DelegateError, "cast dtype",
           f"one of {sorted(CAST_DTYPES)}", repr(attrs["dtype"]))
    return _same_shape(in_shapes, attrs)


def _lower_cast(ctx, node):
    if not _folded_constant(ctx, node):
        dtype = str(node.meta["val"].dtype).removeprefix("torch.")
        ctx.emit("cast", [ctx.tensor(node.args[0])], [ctx.output(node)], dtype=dtype)


def _infer_copy(in_shapes, attrs):
    one_input(in_shapes, 2)
    dst, src = tuple(in_shapes[0]), tuple(in_shapes[1])
    expect(broadcast(dst, src) == dst, DelegateError, "copy source shape",
           f"{dst} or a shape that broadcasts to it", src)
    return [dst]


def _lower_copy(ctx, node):
    dst, src = node.args[:2]
    dv, sv = dst.meta["val"], src.meta["val"]
    if ctx.dims(dv.shape) == ctx.dims(sv.shape) and dv.dtype == sv.dtype:
        ctx.alias(node, ctx.tensor(src))
        return
    ctx.emit("copy", [ctx.tensor(dst), ctx.tensor(src)], [ctx.output(node)])


register_op("view", ("aten.view_copy.default", "aten._unsafe_view.default"), _infer_view,
            _lower_view, dtypes=FOUR_BYTE, check=four_byte_inputs,
            doc="reshape; sizes may hold one -1", attrs={"sizes": "symints"}, arity=(1, 1))
register_op("expand", ("aten.expand_copy.default",), _infer_expand, _lower_expand,
            dtypes=FOUR_BYTE, check=four_byte_inputs, doc="broadcast to sizes; -1 keeps a dim",
            attrs={"sizes": "symints"}, arity=(1, 1))
register_op("permute", ("aten.permute_copy.default", "aten.transpose_copy.int",
                        "aten.t_copy.default"), _infer_permute, _lower_permute,
            dtypes=FOUR_BYTE, check=four_byte_inputs,
            doc="reorder dims (transpose and t lower to a permutation)",
            attrs={"dims": "ints"}, arity=(1, 1))
register_op("slice", ("aten.slice_copy.Tensor",), _infer_slice, _lower_slice,
            dtypes=FOUR_BYTE, check=four_byte_inputs,
            doc="start:end:step along dim, torch clamping (any 4-byte dtype: masks too)",
            attrs={"dim": "int", "start": "symint?", "end": "symint?", "step": "int"},
            arity=(1, 1))
register_op("select", ("aten.select_copy.int",), _infer_select, _lower_select,
            dtypes=FOUR_BYTE, check=four_byte_inputs,
            doc="index along dim, negative from the end (any 4-byte dtype: positions too)",
            attrs={"dim": "int", "index": "symint"}, arity=(1, 1))
register_op("cat", ("aten.cat.default",), _infer_cat, _lower_cat, dtypes=FOUR_BYTE,
            check=_check_cat, doc="concatenate any number of tensors of one dtype along dim",
            attrs={"dim": "int"}, arity=((1, None), 1))
register_op("split", ("aten.split_with_sizes_copy.default",), _infer_split, _lower_split,
            dtypes=FOUR_BYTE, check=four_byte_inputs,
            doc="split along dim into pieces of the given sizes",
            attrs={"split_sizes": "symints", "dim": "int"}, arity=(1, (1, None)))
register_op("unsqueeze", ("aten.unsqueeze_copy.default",), _infer_unsqueeze, _lower_unsqueeze,
            dtypes=FOUR_BYTE, check=four_byte_inputs, doc="insert a size-1 dim",
            attrs={"dim": "int"}, arity=(1, 1))
register_op("squeeze", ("aten.squeeze_copy.dims", "aten.squeeze_copy.dim",
                        "aten.squeeze_copy.default"), _infer_squeeze, _lower_squeeze,
            dtypes=FOUR_BYTE, check=four_byte_inputs, doc="drop size-1 dims",
            attrs={"dims": "ints"}, arity=(1, 1))
register_op("clone", ("aten.clone.default", "aten.alias_copy.default",
                      "dim_order_ops._clone_dim_order.default"), _same_shape, _lower_clone,
            dtypes=FOUR_BYTE, check=_check_copy_of(four_byte_inputs), doc="contiguous copy",
            attrs={}, arity=(1, 1))
register_op("cast", ("dim_order_ops._to_dim_order_copy.default", "aten._to_copy.default"),
            _infer_cast, _lower_cast, dtypes=FOUR_BYTE,
            check=_check_copy_of(four_byte_inputs),
            doc="x.to(dtype) among float32, int32, int64 and bool, as torch converts",
            attrs={"dtype": "str"}, arity=(1, 1))
register_op("copy", ("aten.copy.default",), _infer_copy, _lower_copy, dtypes=FOUR_BYTE,
            check=four_byte_inputs,
            doc="functional dst.copy_(src): src broadcast to dst's shape, in dst's dtype",
            attrs={}, arity=(2, 1))
register_op("slice_scatter", _SCATTER_TARGETS,
            _infer_slice_scatter, _lower_slice_scatter, dtypes=FOUR_BYTE,
            check=_check_slice_scatter,
            doc="dst with rows [start, start + n) of dim replaced by src (a cache write)",
            attrs={"dim": "int", "start": "symint", "src_dims": "ints"}, arity=(2, 1))
register_op("slice_scatter_", (), _infer_slice_scatter, _lower_slice_scatter, dtypes=FOUR_BYTE,
            doc="slice_scatter into dst's own buffer (emitted where nothing reads dst later)",
            attrs={"dim": "int", "start": "symint", "src_dims": "ints"}, arity=(2, 1),
            in_place=True)
register_op("slice_scatter_pair", (), infer_slice_scatter_pair, _lower_slice_scatter_pair,
            dtypes=FOUR_BYTE,
            doc="two slice_scatter_ writes at one position in one node (a layer's k and v cache "
                "writes), each bit for bit its own; emitted by the cache_write pass",
            attrs={"dim": "int", "start": "symint", "src_dims": "ints", "src_dims1": "ints"},
            arity=(4, 1), in_place=True)


# ExecuTorch's custom KV cache (source_transformation/custom_kv_cache.py) writes through
# llama.update_cache(value [B, S, H, D], cache [B, S_max, H, D], start_pos), a mutating op that
# export wraps in auto_functionalized_v2; element 1 of its result is the updated cache.
_UPDATE_CACHE = "llama.update_cache.default"


def _update_cache_args(node):
    """(value, cache, start expr) of an auto_functionalized_v2 over llama.update_cache."""
    op = node.args[0] if node.args else None
    bases = node.kwargs.get("_all_bases") or []
    if target_name(op) != _UPDATE_CACHE or len(bases) != 1 or \
            node.kwargs.get("_cache_base_index") != 0:
        return None
    start = host_values.expr_of(node.kwargs.get("start_pos"))
    value = node.kwargs.get("value")
    return None if start is None or value is None else (value, bases[0], start)


def _match_update_cache(node):
    found = _update_cache_args(node)
    if found is None:
        return "expected llama.update_cache(value, cache, start_pos) at a host-known position"
    value, cache = (x.meta["val"] for x in found[:2])
    if value.dtype != torch.float32 or cache.dtype != torch.float32 or value.dim() != 4 or \
            cache.dim() != 4 or [str(d) for i, d in enumerate(value.shape) if i != 1] != \
            [str(d) for i, d in enumerate(cache.shape) if i != 1]:
        return (f"value {tuple(value.shape)} / cache {tuple(cache.shape)}: expected float32 "
                "[B, S, H, D] into [B, S_max, H, D]")
    return None


def _lower_update_cache(ctx, node):
    _, new = ctx.outputs(node)   # (update_cache's own dummy result, the updated cache)
    _emit_write(ctx, *write_inputs(ctx, node), new)


register_pattern("slice_scatter", "auto_functionalized_v2", _match_update_cache,
                 _lower_update_cache, doc="llama.update_cache: rows [start, start + S) of dim 1")

"""The copy family: every shape op that moves data is one strided copy (shape.wgsl).

view, unsqueeze, squeeze and clone of our contiguous buffers change metadata only: they are
registered as aliases and run no dispatch. permute, expand, slice and select are one copy each;
cat and split are one copy per input or output piece, written at its offset. Each moves
4-byte elements as their bits whatever the dtype (float32, int32, int64 held as i32, bool as
u32 0 / 1). cast and copy are one strided copy that converts each element between dtypes on
the way. slice_scatter_pair
is two row copies (a layer's k and v cache writes) in one grid.
"""
from __future__ import annotations

from kernels_wgsl import (KIND_PRELUDE, Dispatch, broadcast_strides, contiguous_strides,
                          element_kind, groups, numel, padded, register_wgsl, words)
from delegate.shape_math import norm_dim, slice_bounds

WG = 256

for _name in ("view", "unsqueeze", "squeeze", "clone"):
    register_wgsl(_name, alias=True)(None)


def copy_params(shape, src_strides, dst_strides, src_offset: int = 0, dst_offset: int = 0):
    """(params, workgroups) of one strided copy over `shape`."""
    fields = _copy_fields(shape, src_strides, dst_strides, src_offset, dst_offset)
    return words(*fields), groups(numel(shape), WG)


def _copy_fields(shape, src_strides, dst_strides, src_offset: int, dst_offset: int) -> list:
    """The words of one CopyParams struct (shape.wgsl)."""
    return [numel(shape), len(shape), src_offset, dst_offset, padded(shape), padded(src_strides),
            padded(dst_strides)]


def _copy(sizes, src: int = 0, dst: int = 1, label: str = "strided_copy",
          constants: tuple = ()) -> Dispatch:
    return Dispatch("shape", "strided_copy", (src, dst), (dst,), sizes, constants, label=label,
                    prelude=KIND_PRELUDE, fixed_grid=any_offset)


def any_offset(ins, attrs) -> bool:
    """A strided copy's grid covers the shape it copies (a live shape), whatever offset its
    slice or scatter starts at."""
    return True


def _conversion(src_dtype, dst_dtype) -> tuple:
    """The pipeline constants of a strided copy converting src_dtype to dst_dtype."""
    return ("SRC", element_kind(src_dtype)), ("DST", element_kind(dst_dtype))


def _broadcast_source(ins, outs, attrs):
    """The copy of the last input, broadcast, into the contiguous output."""
    return copy_params(outs[0], broadcast_strides(ins[-1], outs[0]), contiguous_strides(outs[0]))


@register_wgsl("cast")
def cast(ins, outs, attrs, info):
    return [_copy(_broadcast_source, 0, 1, "cast", _conversion(info.in_dtypes[0], attrs["dtype"]))]


@register_wgsl("copy")
def copy(ins, outs, attrs, info):
    # dst (operand 0) gives only the shape and dtype: its values are not read
    conversion = _conversion(info.in_dtypes[1], info.in_dtypes[0])
    return [_copy(_broadcast_source, 1, 2, "copy", conversion)]


@register_wgsl("permute")
def permute(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        own = contiguous_strides(ins[0])
        dims = [norm_dim(d, len(ins[0])) for d in attrs["dims"]]
        return copy_params(outs[0], [own[d] for d in dims], contiguous_strides(outs[0]))

    return [_copy(sizes, label="permute")]


@register_wgsl("expand")
def expand(ins, outs, attrs, info):
    return [_copy(_broadcast_source, label="expand")]


@register_wgsl("slice")
def slice_(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        d = norm_dim(attrs["dim"], len(ins[0]))
        start, _, step = slice_bounds(ins[0][d], attrs["start"], attrs["end"], attrs["step"])
        own = contiguous_strides(ins[0])
        strides = own[:d] + [own[d] * step] + own[d + 1:]
        return copy_params(outs[0], strides, contiguous_strides(outs[0]), start * own[d])

    return [_copy(sizes, label="slice")]


@register_wgsl("select")
def select(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        d = norm_dim(attrs["dim"], len(ins[0]))
        index = attrs["index"] % ins[0][d]
        own = contiguous_strides(ins[0])
        return copy_params(outs[0], own[:d] + own[d + 1:], contiguous_strides(outs[0]),
                           index * own[d])

    return [_copy(sizes, label="select")]


@register_wgsl("cat")
def cat(ins, outs, attrs, info):
    """One copy per input, each into its band of the output along dim."""
    out_index = len(ins)

    def piece(k):
        def sizes(ins, outs, attrs):
            d = norm_dim(attrs["dim"], len(outs[0]))
            if tuple(ins[k]) == (0,) and len(outs[0]) != 1:  # torch skips legacy empty inputs
                return copy_params((0,), [0], [0])
            before = sum(s[d] for s in ins[:k] if not (tuple(s) == (0,) and len(outs[0]) != 1))
            dst = contiguous_strides(outs[0])
            return copy_params(ins[k], contiguous_strides(ins[k]), dst, 0, before * dst[d])

        return sizes

    return [_copy(piece(k), k, out_index, label="cat") for k in range(len(ins))]


@register_wgsl("split")
def split(ins, outs, attrs, info):
    """One copy per output piece, each from its band of the input along dim."""

    def piece(k):
        def sizes(ins, outs, attrs):
            d = norm_dim(attrs["dim"], len(ins[0]))
            own = contiguous_strides(ins[0])
            before = sum(s[d] for s in outs[:k])
            return copy_params(outs[k], own, contiguous_strides(outs[k]), before * own[d])

        return sizes

    return [_copy(piece(k), 0, 1 + k, label="split") for k in range(len(outs))]


def rows_copy(src_shape, dst_shape, perm, attrs) -> list:
    """The CopyParams fields of src (read through the permutation perm; empty: as it is) into
    rows [start, start + n) of dim of dst."""
    perm = perm or list(range(len(src_shape)))
    base = contiguous_strides(src_shape)
    src, strides = [src_shape[i] for i in perm], [base[i] for i in perm]
    own = contiguous_strides(dst_shape)
    d = norm_dim(attrs["dim"], len(dst_shape))
    return _copy_fields(src, strides, own, 0, attrs["start"] * own[d])


def _rows_params(ins, outs, attrs):
    """The strided copy of src (operand 1) into rows of the output (operand 2)."""
    fields = rows_copy(ins[1], outs[0], attrs.get("src_dims"), attrs)
    return words(*fields), groups(fields[0], WG)


@register_wgsl("slice_scatter")
def slice_scatter(ins, outs, attrs, info):
    def whole(ins, outs, attrs):
        return copy_params(outs[0], contiguous_strides(ins[0]), contiguous_strides(outs[0]))

    return [_copy(whole, 0, 2, label="slice_scatter"), _copy(_rows_params, 1, 2, "slice_scatter")]


@register_wgsl("slice_scatter_")
def slice_scatter_(ins, outs, attrs, info):
    # dst (operand 0) is not bound: it is the output's buffer, bound once, read-write
    return [_copy(_rows_params, 1, 2, label="slice_scatter_")]


@register_wgsl("slice_scatter_pair")
def slice_scatter_pair(ins, outs, attrs, info):
    # operands dst, src, dst1, src1, dst'; bindings src, dst' (dst's own buffer), src1 and dst1,
    # written in place as an input: the executors alias only output 0 (delegate/ops/shape.py)
    def sizes(ins, outs, attrs):
        a = rows_copy(ins[1], outs[0], attrs["src_dims"], attrs)
        b = rows_copy(ins[3], ins[2], attrs["src_dims1"], attrs)
        return words(*a, *b), groups(a[0] + b[0], WG)

    return [Dispatch("shape", "strided_copy_pair", (1, 4, 3, 2), (4, 2), sizes,
                     label="slice_scatter_pair", prelude=KIND_PRELUDE, fixed_grid=any_offset)]

"""Creation kernels (creation.wgsl): arange, full, triu / tril and cumsum, one dispatch each.

The result's kind (f32 or i32: int64 is held as i32) comes from attribute `dtype` as a
pipeline constant; numbers travel in the params as their bits in that kind (words packs a
Python float as f32, an int as i32). triu and tril are one entry point, LOWER picking.
"""
from __future__ import annotations

from delegate.shape_math import norm_dim
from kernels_wgsl import (KIND_PRELUDE, Dispatch, element_kind, groups, numel, register_wgsl,
                          words)

WG = 256


def _in_kind(value, attrs):
    """value as the result's kind holds it: a float for f32, an int otherwise."""
    return float(value) if attrs["dtype"] == "float32" else int(value)


def _dispatch(entry: str, args: tuple, sizes, label: str, constants: tuple = ()):
    return Dispatch("creation", entry, args, (args[-1],), sizes, constants, label=label,
                    prelude=KIND_PRELUDE)


def _kind(attrs) -> tuple:
    return (("KIND", element_kind(attrs["dtype"])),)


@register_wgsl("arange")
def arange(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        n = numel(outs[0])
        return words(n, _in_kind(attrs["start"], attrs), _in_kind(attrs["step"], attrs), 0), \
            groups(n, WG)

    return [_dispatch("arange", (0,), sizes, "arange", _kind(attrs))]


@register_wgsl("full")
def full(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        n = numel(outs[0])
        return words(n, _in_kind(attrs["value"], attrs)), groups(n, WG)

    return [_dispatch("fill", (0,), sizes, "full")]


def _triangle(lower: bool):
    def build(ins, outs, attrs, info):
        def sizes(ins, outs, attrs):
            rows, cols = outs[0][-2:]
            diagonal = min(max(attrs["diagonal"], -rows), cols)
            return words(numel(outs[0]), rows, cols, diagonal), groups(numel(outs[0]), WG)

        return [_dispatch("triangle", (0, 1), sizes, "tril" if lower else "triu",
                          (("LOWER", int(lower)),))]

    return build


register_wgsl("triu")(_triangle(False))
register_wgsl("tril")(_triangle(True))


@register_wgsl("cumsum")
def cumsum(ins, outs, attrs, info):
    def sizes(ins, outs, attrs):
        shape = list(ins[0]) or [1]
        d = norm_dim(attrs["dim"], len(shape))
        inner = numel(shape[d + 1:])
        lines = numel(shape) // max(shape[d], 1)
        return words(lines, shape[d], inner, 0), groups(lines if shape[d] else 0, WG)

    source = (("SRC_KIND", element_kind(info.in_dtypes[0])),)
    return [_dispatch("cumsum", (0, 1), sizes, "cumsum", _kind(attrs) + source)]

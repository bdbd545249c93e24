"""Reductions (reduction.wgsl): sum, mean, amax, amin, var, argmax, argmin and median over any
dims, one workgroup per output element, reading the input through kept-dim and reduced-dim
strides (no transposes)."""
from __future__ import annotations

from kernels_wgsl import Dispatch, contiguous_strides, numel, padded, register_wgsl, words


def _split(shape, dims) -> tuple:
    """(kept shape, kept strides, reduced shape, reduced strides) of a contiguous input."""
    rank = len(shape)
    red = sorted({d % rank for d in dims}) if dims else list(range(rank))
    strides = contiguous_strides(shape)
    kept = [d for d in range(rank) if d not in red]
    return ([shape[d] for d in kept], [strides[d] for d in kept],
            [shape[d] for d in red], [strides[d] for d in red])


def _sizes(ins, outs, attrs) -> tuple:
    """(params, one workgroup per output element) at the live input shape."""
    kshape, kstrides, rshape, rstrides = _split(list(ins[0]), attrs["dims"])
    n_out = numel(kshape)
    params = words(n_out, numel(rshape), len(kshape), len(rshape),
                   float(attrs.get("correction", 0.0)), 0, 0, 0,
                   padded(kshape), padded(kstrides), padded(rshape), padded(rstrides))
    return params, n_out


def _builder(name: str):
    def build(ins, outs, attrs, info):
        if attrs.get("indices"):   # median.dim: values and their indices
            return [Dispatch("reduction", "reduce_median_indices", (0, 1, 2), (1, 2), _sizes,
                             label=name)]
        return [Dispatch("reduction", f"reduce_{name}", (0, 1), (1,), _sizes, label=name)]

    return build


for _name in ("sum", "mean", "amax", "amin", "var", "argmax", "argmin", "median"):
    register_wgsl(_name)(_builder(_name))

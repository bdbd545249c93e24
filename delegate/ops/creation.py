"""Creation ops: the tensors a model builds its positions and masks from.

- arange(start, end, step): out[i] = start + i * step for i < ceil((end - start) / step), as
  int32, int64 or float32. The bounds may be symbolic (end = T from a size query); an integer
  arange takes integer start and step.
- full(sizes, value): every element `value`, in any of our dtypes (bool too). zeros, ones and
  new_full reach edge as it; full_like(x, value) is full of x's shape and scalar_tensor(value)
  full of shape []. The value is converted to the dtype at lowering, as torch converts it
  (to an integer it truncates toward 0).
- cumsum(x, dim): out[..., k, ...] = sum of x[..., j, ...] over j <= k along dim, float32 or
  integer (torch sums bool and integer inputs as int64). The WGSL kernel adds in order of j
  (one thread per line), the CPU kernel is torch's.
- triu / tril(x, diagonal): x[..., r, c] where c - r >= diagonal (triu) or <= diagonal (tril)
  over the last two dims, 0 elsewhere; kept from decomposition (edge would spell them as
  aranges, a subtraction, a comparison and a where).

A host-known integer range or number (`arange(T)`, `arange(T) + pos`, delegate/host_values.py)
lowers to nothing while its users take it as an attribute (a cache write at pos); where a
kernel reads it as a tensor, `lower_host_tensor` emits it there as an arange (a 0-d one as a
full of shape []). Attribute `dtype` names the result's dtype for the WGSL kernels, which see
only shapes.

WebGPU holds int64 as i32 (kernels_wgsl.element_kind): there the check refuses integer bounds
and fill values past 32 bits, which the kernel could not take.
"""
from __future__ import annotations

import math

import torch

from delegate import host_values
from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops._common import (FOUR_BYTE, arg, claiming_device, four_byte_inputs, norm_dim,
                                  one_input)
from delegate.ops.export import target_name

ARANGE_DTYPES = (torch.float32, torch.int32, torch.int64)
_I32 = (-(2 ** 31), 2 ** 31)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_of(node) -> torch.dtype:
    return node.meta["val"].dtype


def _expect_dtype(attrs, allowed) -> None:
    names = [dtype_name(d) for d in allowed]
    expect(attrs["dtype"] in names, DelegateError, "dtype attribute", f"one of {names}",
           repr(attrs["dtype"]))


def _webgpu_int32(values, what: str) -> "str | None":
    """Reason when an integer that a WGSL kernel takes as i32 does not fit one."""
    if claiming_device() != "webgpu":
        return None
    big = [v for v in values if isinstance(v, int) and not _I32[0] <= v < _I32[1]]
    return f"{what} {big[0]} on webgpu: expected a 32-bit integer" if big else None


def _contiguous_result(node) -> "str | None":
    order = tuple(node.meta["val"].dim_order())
    if order != tuple(range(len(order))):
        return f"result: expected contiguous dim order, got {list(order)}"
    return None


# ---- arange -------------------------------------------------------------------------------
def arange_length(start, end, step) -> int:
    """torch's element count: ceil((end - start) / step), in integers when all three are."""
    expect(step != 0, DelegateError, "arange step", "a nonzero step", step)
    if all(isinstance(v, int) for v in (start, end, step)):
        n = -((start - end) // step)
    else:
        n = math.ceil((end - start) / step)
    expect(n >= 0, DelegateError, "arange bounds", f"end on the side of start that step {step} "
           f"moves to", f"start {start}, end {end}")
    return n


def _infer_arange(in_shapes, attrs):
    _expect_dtype(attrs, ARANGE_DTYPES)
    return [(arange_length(attrs["start"], attrs["end"], attrs["step"]),)]


def _bounds(node) -> list:
    """[start, end, step] as the node gives them, for every arange overload."""
    if target_name(node.target) == "aten.arange.default":
        return [0, node.args[0], 1]
    step = node.args[2] if len(node.args) > 2 else node.kwargs.get("step", 1)
    return [node.args[0], node.args[1], step]


def _bound(x):
    """An arange bound as an attribute: a float, an int or a SymInt's expression; None for
    anything else (a SymFloat)."""
    return x if isinstance(x, float) else host_values.expr_of(x)


def _check_arange(node):
    given = _bounds(node)
    start, end, step = bounds = [_bound(b) for b in given]
    if any(b is None for b in bounds):
        return (f"start, end, step: expected ints, floats or SymInts, got "
                f"{[type(b).__name__ for b in given]}")
    if step == 0:
        return "step: expected a nonzero step, got 0"
    if _dtype_of(node) != torch.float32 and (isinstance(start, float) or isinstance(step, float)):
        return f"integer arange: expected integer start and step, got {start!r}, {step!r}"
    return _webgpu_int32(bounds, "arange bound")


def _emit_arange(ctx, node, start, end, step) -> None:
    ctx.emit("arange", [], [ctx.output(node)], start=start, end=end, step=step,
             dtype=dtype_name(_dtype_of(node)))


def _lower_arange(ctx, node):
    _emit_arange(ctx, node, *(_bound(b) for b in _bounds(node)))


register_op("arange", ("aten.arange.start_step", "aten.arange.default", "aten.arange.start"),
            _infer_arange, _lower_arange, dtypes=ARANGE_DTYPES, check=_check_arange,
            attrs={"start": "symnumber", "end": "symnumber", "step": "symnumber",
                   "dtype": "str"}, arity=(0, 1),
            doc="start + i * step for i < ceil((end - start) / step); symbolic bounds")


# ---- full ---------------------------------------------------------------------------------
def _infer_full(in_shapes, attrs):
    _expect_dtype(attrs, FOUR_BYTE)
    sizes = tuple(attrs["sizes"])
    expect(all(s >= 0 for s in sizes), DelegateError, "full sizes", "sizes >= 0", list(sizes))
    return [sizes]


def _sizes_and_value(node) -> tuple:
    """(sizes, fill value) of full, full_like and scalar_tensor."""
    name = target_name(node.target)
    if name == "aten.full_like.default":
        return list(node.args[0].meta["val"].shape), node.args[1]
    if name == "aten.scalar_tensor.default":
        return [], node.args[0]
    return list(node.args[0]), node.args[1]


def fill_value(value, dtype: torch.dtype):
    """The fill value as the dtype holds it (a symbolic one is resolved at execute)."""
    if isinstance(value, (torch.SymInt, torch.fx.Node)):
        return host_values.expr_of(value)
    if dtype == torch.bool:
        return int(bool(value))
    return float(value) if dtype == torch.float32 else int(value)


def _check_full(node):
    _, value = _sizes_and_value(node)
    dtype = _dtype_of(node)
    if isinstance(value, (torch.SymInt, torch.fx.Node)) and host_values.expr_of(value) is None:
        return f"fill value: expected a number or a SymInt, got {value!r}"
    if isinstance(value, float) and not math.isfinite(value) and dtype in (torch.int32,
                                                                           torch.int64):
        return f"fill value {value} for {dtype}: expected a finite number"
    if dtype not in FOUR_BYTE:
        return f"dtype {dtype}: expected one of {FOUR_BYTE}"
    return _contiguous_result(node) or _webgpu_int32([fill_value(value, dtype)], "fill value")


def _lower_full(ctx, node):
    sizes, value = _sizes_and_value(node)
    dtype = _dtype_of(node)
    ctx.emit("full", [], [ctx.output(node)], sizes=ctx.dims(sizes),
             value=fill_value(value, dtype), dtype=dtype_name(dtype))


register_op("full", ("aten.full.default", "aten.full_like.default",
                     "aten.scalar_tensor.default"), _infer_full, _lower_full, dtypes=FOUR_BYTE,
            check=_check_full, attrs={"sizes": "symints", "value": "symnumber", "dtype": "str"},
            arity=(0, 1), doc="every element `value` (zeros, ones, full_like, scalar_tensor)")


def lower_host_tensor(ctx, node, host) -> None:
    """A host-known integer tensor (delegate/host_values.py) that a kernel reads: its range as
    an arange, its number as a 0-d full, each in the node's dtype."""
    if isinstance(host, host_values.Range):
        end = host_values.plus(host.start, host.length)
        _emit_arange(ctx, node, host.start, end, 1)
    else:
        ctx.emit("full", [], [ctx.output(node)], sizes=[], value=host.expr,
                 dtype=dtype_name(_dtype_of(node)))


# ---- cumsum -------------------------------------------------------------------------------
def _infer_cumsum(in_shapes, attrs):
    one_input(in_shapes)
    _expect_dtype(attrs, ARANGE_DTYPES)
    norm_dim(attrs["dim"], len(in_shapes[0]), "cumsum dim", scalar_ok=True)
    return [tuple(in_shapes[0])]


def _check_cumsum(node):
    dtype = _dtype_of(node)
    if dtype not in ARANGE_DTYPES:
        return f"result dtype {dtype}: expected one of {ARANGE_DTYPES}"
    return four_byte_inputs(node)


def _lower_cumsum(ctx, node):
    rank = node.meta["val"].dim()
    ctx.emit("cumsum", [ctx.tensor(node.args[0])], [ctx.output(node)],
             dim=norm_dim(arg(node, 1, "dim", 0), rank, "cumsum dim", scalar_ok=True),
             dtype=dtype_name(_dtype_of(node)))


register_op("cumsum", ("aten.cumsum.default",), _infer_cumsum, _lower_cumsum,
            dtypes=FOUR_BYTE, check=_check_cumsum, attrs={"dim": "int", "dtype": "str"},
            arity=(1, 1), doc="running sum along dim; float32, or int64 from bool / integers")


# ---- triu / tril ----------------------------------------------------------------------------
def _infer_triangle(in_shapes, attrs):
    one_input(in_shapes)
    expect(len(in_shapes[0]) >= 2, DelegateError, "triu / tril input", "rank >= 2",
           f"rank {len(in_shapes[0])}")
    return [tuple(in_shapes[0])]


def _check_triangle(node):
    # kept from decomposition: asked on the ATen graph too, where x may be a strided view,
    # so only the dtype is checked there (edge hands it a contiguous copy)
    x = node.args[0].meta["val"]
    if x.dtype not in FOUR_BYTE:
        return f"input dtype {x.dtype}: expected one of {FOUR_BYTE}"
    if x.dim() < 2:
        return f"input: expected rank >= 2, got rank {x.dim()}"
    return None


def _lower_triangle(name: str):
    def lower(ctx, node):
        ctx.emit(name, [ctx.tensor(node.args[0])], [ctx.output(node)],
                 diagonal=int(arg(node, 1, "diagonal", 0)))

    return lower


for _name, _keeps in (("triu", ">="), ("tril", "<=")):
    register_op(_name, (f"aten.{_name}.default",), _infer_triangle, _lower_triangle(_name),
                dtypes=FOUR_BYTE, check=_check_triangle, keep=(f"aten.{_name}.default",),
                attrs={"diagonal": "int"}, arity=(1, 1),
                doc=f"x[..., r, c] where c - r {_keeps} diagonal, else 0")

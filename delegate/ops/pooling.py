"""2-D pooling and upsampling over the last two dims of [N, C, H, W] (or [C, H, W]):
max_pool2d, avg_pool2d, adaptive_avg_pool2d, upsample_nearest2d and upsample_bilinear2d.

Window attributes are pairs (h, w) as torch's output-size rule reads them:
    out = floor_or_ceil((in + 2 pad - dilation (kernel - 1) - 1) / stride) + 1,
and with ceil_mode a last window that would start in the right padding is dropped.
Upsampling carries the output size and the scale factors edge was given (None: in / out).
max_pool2d is kept whole from decomposition. Where edge decomposes it anyway (the to_edge
then to_backend flow) into max_pool2d_with_indices, a pattern claims that node when only its
values (output 0) are read; with the int64 indices read it stays with ATen, as no kernel
writes them.
"""
from __future__ import annotations

from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops._common import arg, float_dtypes, float_inputs, one_input, only_output0
from delegate.ops.export import register_pattern


def _pair(v, default=None) -> list:
    v = default if v is None or (isinstance(v, (list, tuple)) and not v) else v
    v = [v] if isinstance(v, int) else list(v)
    return [int(e) for e in (v * 2 if len(v) == 1 else v)]


def pool_out_size(size, k, s, p, d, ceil_mode) -> int:
    span = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = span // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _planes(shape, what) -> tuple:
    expect(len(shape) in (3, 4), DelegateError, what, "a [N, C, H, W] or [C, H, W] input",
           f"rank {len(shape)}")
    return tuple(shape[:-2]), shape[-2], shape[-1]


def _infer_window(name):
    def infer(in_shapes, attrs):
        one_input(in_shapes)
        lead, h, w = _planes(in_shapes[0], name)
        k, s, p = attrs["kernel_size"], attrs["stride"], attrs["padding"]
        d = attrs.get("dilation", [1, 1])
        for what, v, lo in (("kernel_size", k, 1), ("stride", s, 1), ("padding", p, 0),
                            ("dilation", d, 1)):
            expect(len(v) == 2 and min(v) >= lo, DelegateError, f"{name} {what}",
                   f"two values >= {lo}", v)
        expect(all(p[i] <= k[i] // 2 for i in range(2)), DelegateError, f"{name} padding",
               f"at most half the kernel {k}", p)
        oh, ow = (pool_out_size(n, k[i], s[i], p[i], d[i], attrs["ceil_mode"])
                  for i, n in enumerate((h, w)))
        expect(oh > 0 and ow > 0, DelegateError, f"{name} output", "a positive size",
               (oh, ow))
        return [lead + (oh, ow)]

    return infer


def _infer_sized(name):
    def infer(in_shapes, attrs):
        one_input(in_shapes)
        lead, h, w = _planes(in_shapes[0], name)
        size = attrs["output_size"]
        expect(len(size) == 2 and min(size) > 0 and h > 0 and w > 0, DelegateError,
               f"{name} output_size", "two sizes > 0 from a non-empty input", size)
        return [lead + tuple(size)]

    return infer


def _check_avg_pool(node):
    if arg(node, 6, "divisor_override") is not None:
        return f"divisor_override: expected None, got {arg(node, 6, 'divisor_override')}"
    return float_inputs(node)


def _static_size(node) -> "str | None":
    shape = node.meta["val"].shape
    if not all(isinstance(s, int) for s in shape):
        return f"output shape: expected static sizes, got {list(shape)}"
    return float_inputs(node)


def _window_attrs(node, with_dilation: bool) -> dict:
    k = _pair(node.args[1])
    attrs = {"kernel_size": k, "stride": _pair(arg(node, 2, "stride"), k),
             "padding": _pair(arg(node, 3, "padding", 0))}
    if with_dilation:
        attrs["dilation"] = _pair(arg(node, 4, "dilation", 1))
    return attrs


def _lower_max_pool(ctx, node, values=None):
    """values: the node whose tensor the pooled maxima are (max_pool2d_with_indices' getitem 0)."""
    ctx.emit("max_pool2d", [ctx.tensor(node.args[0])], [ctx.output(values or node)],
             **_window_attrs(node, True), ceil_mode=bool(arg(node, 5, "ceil_mode", False)))


def _match_max_pool_with_indices(node):
    if only_output0(node) is None:
        return "outputs: expected only output 0 (the maxima) read, not the indices"
    if node.args[0].meta["val"].dim() not in (3, 4):
        return f"input rank: expected 3 or 4, got {node.args[0].meta['val'].dim()}"
    return float_inputs(node)


def _lower_max_pool_with_indices(ctx, node):
    _lower_max_pool(ctx, node, only_output0(node))


def _lower_avg_pool(ctx, node):
    ctx.emit("avg_pool2d", [ctx.tensor(node.args[0])], [ctx.output(node)],
             **_window_attrs(node, False), ceil_mode=bool(arg(node, 4, "ceil_mode", False)),
             count_include_pad=bool(arg(node, 5, "count_include_pad", True)))


def _out_hw(node) -> list:
    return [int(s) for s in node.meta["val"].shape[-2:]]


def _lower_adaptive(ctx, node):
    ctx.emit("adaptive_avg_pool2d", [ctx.tensor(node.args[0])], [ctx.output(node)],
             output_size=_out_hw(node))


def _scales(node, index: int):
    s = arg(node, index, "scale_factors")
    return None if s is None else [float(v) for v in (list(s) * 2 if len(s) == 1 else s)]


def _lower_nearest(ctx, node):
    ctx.emit("upsample_nearest2d", [ctx.tensor(node.args[0])], [ctx.output(node)],
             output_size=_out_hw(node), scales=_scales(node, 2))


def _lower_bilinear(ctx, node):
    ctx.emit("upsample_bilinear2d", [ctx.tensor(node.args[0])], [ctx.output(node)],
             output_size=_out_hw(node), align_corners=bool(arg(node, 2, "align_corners")),
             scales=_scales(node, 3))


_WINDOW = {"kernel_size": "ints", "stride": "ints", "padding": "ints", "ceil_mode": "bool"}
register_op("max_pool2d", ("aten.max_pool2d.default",),
            _infer_window("max_pool2d"), _lower_max_pool, check=float_dtypes,
            keep=("aten.max_pool2d.default",),
            doc="max over each dilated window; NaN propagates; kept whole (no indices)",
            attrs={**_WINDOW, "dilation": "ints"}, arity=(1, 1))
register_pattern("max_pool2d", "aten.max_pool2d_with_indices.default",
                 _match_max_pool_with_indices, _lower_max_pool_with_indices,
                 doc="max_pool2d_with_indices whose indices nothing reads")
register_op("avg_pool2d", ("aten.avg_pool2d.default",), _infer_window("avg_pool2d"),
            _lower_avg_pool, check=_check_avg_pool,
            doc="mean over each window; count_include_pad, ceil_mode; no divisor_override",
            attrs={**_WINDOW, "count_include_pad": "bool"}, arity=(1, 1))
register_op("adaptive_avg_pool2d", ("aten._adaptive_avg_pool2d.default",),
            _infer_sized("adaptive_avg_pool2d"), _lower_adaptive, check=_static_size,
            doc="mean over rows [floor(i H / OH), ceil((i + 1) H / OH)), and columns alike",
            attrs={"output_size": "ints"}, arity=(1, 1))
register_op("upsample_nearest2d", ("aten.upsample_nearest2d.vec",),
            _infer_sized("upsample_nearest2d"), _lower_nearest, check=_static_size,
            doc="x[min(floor(i * scale), H - 1)], scale = 1 / factor or H / OH",
            attrs={"output_size": "ints", "scales": "floats?"}, arity=(1, 1))
register_op("upsample_bilinear2d", ("aten.upsample_bilinear2d.vec",),
            _infer_sized("upsample_bilinear2d"), _lower_bilinear, check=_static_size,
            doc="bilinear interpolation, align_corners true or false",
            attrs={"output_size": "ints", "align_corners": "bool", "scales": "floats?"},
            arity=(1, 1))

"""Pooling and upsampling (pooling.wgsl): one thread per output element over N * C planes."""
from __future__ import annotations

from kernels_wgsl import Dispatch, groups, numel, register_wgsl, words

WG = 64


def _resize_scale(size: int, out: int, factor, align_corners: bool) -> float:
    """ATen's area_pixel_compute_scale: source step per output step."""
    if align_corners:
        return (size - 1) / (out - 1) if out > 1 else 0.0
    return 1.0 / factor if factor else size / out


def _params(x, y, attrs) -> bytes:
    ih, iw, oh, ow = x[-2], x[-1], y[-2], y[-1]
    k = attrs.get("kernel_size", [1, 1])
    s = attrs.get("stride", [1, 1])
    pad = attrs.get("padding", [0, 0])
    dil = attrs.get("dilation", [1, 1])
    flag = attrs.get("count_include_pad", attrs.get("align_corners", False))
    align = bool(attrs.get("align_corners", False))
    factors = attrs.get("scales") or [None, None]
    sh, sw = (_resize_scale(n, o, f, align) for n, o, f in ((ih, oh, factors[0]),
                                                             (iw, ow, factors[1])))
    return words(numel(y), ih, iw, oh, ow, k[0], k[1], s[0], s[1], pad[0], pad[1], dil[0],
                 dil[1], int(flag), 0, 0, float(sh), float(sw))


def _builder(entry: str):
    def build(ins, outs, attrs, info):
        def sizes(ins, outs, attrs):
            return _params(ins[0], outs[0], attrs), groups(numel(outs[0]), WG)

        return [Dispatch("pooling", entry, (0, 1), (1,), sizes, label=entry)]

    return build


for _entry in ("max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "upsample_nearest2d",
               "upsample_bilinear2d"):
    register_wgsl(_entry)(_builder(_entry))

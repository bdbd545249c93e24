"""rms_norm and layer_norm (normalization.wgsl): one workgroup per row of the trailing
normalized dims; absent weight or bias bind nothing the shader reads. Rows whose length is a
multiple of 4 are read as vec4s."""
from __future__ import annotations

from kernels_wgsl import Dispatch, numel, register_wgsl, words

F32_EPS = 1.1920928955078125e-07   # torch.finfo(torch.float32).eps: rms_norm's eps=None


# The shader's lane type V, its width LANES and total(): the sum of a lane's components.
_LANES = {
    1: "alias V = f32;\nconst LANES: u32 = 1u;\nfn total(v: f32) -> f32 { return v; }\n"
       "fn add_squares(ss: f32, v: f32) -> f32 { return fma(v, v, ss); }",
    4: "alias V = vec4<f32>;\nconst LANES: u32 = 4u;\n"
       "fn total(v: vec4<f32>) -> f32 { return (v.x + v.y) + (v.z + v.w); }\n"
       "fn add_squares(ss: f32, v: vec4<f32>) -> f32 { return add_squares4(ss, v); }",
}


def _vec4(attrs) -> bool:
    """vec4 lanes where the row length is a known multiple of 4 (the weight's and bias's rows
    are the same length, and every binding starts 256-byte aligned)."""
    dims = attrs["normalized_shape"]
    return all(type(d) is int for d in dims) and numel(dims) % 4 == 0


def _prelude(attrs) -> str:
    return _LANES[4 if _vec4(attrs) else 1]


def _rows(x, normalized) -> tuple:
    d = numel(normalized)
    return (numel(x) // d if d else 0), d


def rms_norm_dispatch(x: int, weight, out: int, sizes, vec4: bool, scratch=()) -> Dispatch:
    """The rms_norm kernel over operands x, weight (None: absent) and out; sizes(ins, outs,
    attrs) -> (rms_norm_params(..), rows). Also the fused-norm q4gsw ops' at M > 1
    (kernels_wgsl/q4gsw.py), writing their scratch."""
    consts = (("HAS_WEIGHT", int(weight is not None)), ("HAS_BIAS", 0))
    return Dispatch("normalization", "rms_norm", (x, weight, None, out), (out,), sizes, consts,
                    label="rms_norm", prelude=_LANES[4 if vec4 else 1], scratch=tuple(scratch))


def rms_norm_params(rows: int, d: int, eps: float) -> bytes:
    return words(rows, d, float(eps))


@register_wgsl("rms_norm")
def rms_norm(ins, outs, attrs, info):
    has_w = len(ins) > 1 and ins[1] is not None

    def sizes(ins, outs, attrs):
        rows, d = _rows(ins[0], attrs["normalized_shape"])
        eps = F32_EPS if attrs.get("eps") is None else float(attrs["eps"])
        return rms_norm_params(rows, d, eps), rows

    return [rms_norm_dispatch(0, 1 if has_w else None, 2, sizes, _vec4(attrs))]


@register_wgsl("layer_norm")
def layer_norm(ins, outs, attrs, info):
    has_w, has_b = ins[1] is not None, ins[2] is not None
    stats = bool(attrs.get("stats"))

    def sizes(ins, outs, attrs):
        rows, d = _rows(ins[0], attrs["normalized_shape"])
        return words(rows, d, float(attrs["eps"])), rows

    args = (0, 1 if has_w else None, 2 if has_b else None, 3, 4 if stats else None,
            5 if stats else None)
    writes = (3, 4, 5) if stats else (3, None)   # None: the unused stats bindings
    consts = (("HAS_WEIGHT", int(has_w)), ("HAS_BIAS", int(has_b)), ("STATS", int(stats)))
    return [Dispatch("normalization", "layer_norm", args, writes, sizes, consts,
                     label="layer_norm", prelude=_prelude(attrs))]

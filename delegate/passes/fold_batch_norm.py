"""Fold an inference batch norm into the convolution that feeds it.

    s  = gamma / sqrt(var + eps)              per output channel
    w' = w * s                                (along the weight's output-channel dim 0)
    b' = (b - mean) * s + beta                (b = 0 when the convolution has no bias)

Matches a plain (not transposed) convolution whose output only the batch norm reads, where the
convolution's weight and bias and all batch-norm parameters are program constants. The
convolution is then lowered with w', b' and writes the batch norm's output; the batch norm
emits nothing. The new constants are computed in float64 and stored in the weight's dtype.
"""
from __future__ import annotations

import torch

from delegate.passes._match import lower_nothing as _lower_nothing
from delegate.ops._common import only_output0
from delegate.ops.export import constant_value, target_name
from delegate.ops.linear import conv_attrs

BATCH_NORM = "aten._native_batch_norm_legit_no_training.default"
CONVOLUTION = "aten.convolution.default"


def detect(graph) -> dict:
    rewrites = {}
    for bn in graph.nodes:
        if bn.op != "call_function" or target_name(bn.target) != BATCH_NORM:
            continue
        folded = _folded_params(bn)
        if folded is not None:
            conv = bn.args[0]
            rewrites[conv] = _lower_folded(folded, only_output0(bn))
            rewrites[bn] = _lower_nothing
    return rewrites


def _optional_constant(arg):
    """(matched, tensor or None): an absent argument matches as None."""
    if arg is None:
        return True, None
    t = constant_value(arg)
    return t is not None, t


def _folded_params(bn):
    """(w', b') when bn folds into its producer, else None."""
    conv = bn.args[0]
    if (getattr(conv, "op", None) != "call_function" or target_name(conv.target) != CONVOLUTION
            or len(conv.users) != 1 or conv.args[6] or only_output0(bn) is None):
        return None
    params = [_optional_constant(a) for a in (conv.args[2], *bn.args[1:3])]
    weight, mean, var = (constant_value(a) for a in (conv.args[1], bn.args[3], bn.args[4]))
    if weight is None or mean is None or var is None or not all(ok for ok, _ in params):
        return None
    (_, bias), (_, gamma), (_, beta) = params
    eps = float(bn.args[6])
    scale = torch.rsqrt(var.double() + eps)
    if gamma is not None:
        scale = scale * gamma.double()
    shift = -mean.double() * scale
    if bias is not None:
        shift = shift + bias.double() * scale
    if beta is not None:
        shift = shift + beta.double()
    per_channel = (-1,) + (1,) * (weight.dim() - 1)
    w = (weight.double() * scale.view(per_channel)).to(weight.dtype)
    return w, shift.to(weight.dtype)


def _lower_folded(folded, bn_output):
    weight, bias = folded

    def lower(ctx, conv):
        ins = [ctx.tensor(conv.args[0]), ctx.constant(weight), ctx.constant(bias)]
        ctx.emit("convolution", ins, [ctx.output(bn_output)], **conv_attrs(conv))

    return lower

"""linear_q4gsw: linear with 4-bit group-symmetric weights (torchao int4 weight-only).

torchao's `IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(gs))` exports as

    w = torchao.dequantize_affine(qdata int8 [N, K], [1, gs], scale [N, K/gs], zero_point,
                                  torch.int8, -8, 7)    # w[n, k] = qdata[n, k] * scale[n, k/gs]
    y = aten.linear(x, w, bias)

The dequantize is a folded op and the linear is the anchor of the `linear_q4gsw` pattern: the
pair lowers to one IR node whose weights stay packed, in ExecuTorch's q4gsw layout:

    packed  [N, K/2] bytes: k even in the low nibble, k odd in the high one, each stored q + 8.
            Held as its little-endian u32 words, int32 [N, K/8]:
            q[n, k] = ((packed[n, k/8] >> 4*(k%8)) & 0xF) - 8
    scales  float32 [K/gs, N padded to a multiple of 4] (pad columns are 0).

0.5 bytes per parameter for the nibbles plus 4/gs for the scales. Kernels:
kernels_cpu/q4gsw.py and kernels_wgsl/q4gsw.py.

linear_q4gsw takes an optional fifth input, a residual r [..., N] (emitted by
delegate/passes/residual_add.py for `linear(x) + r`): out = (x @ W^T + b) + r, rounded as
the linear and then the add would be, so the fused output is the unfused one bit for bit.

linear_q4gsw_multi is several bias-free linear_q4gsw of one x, equal K and group size, as one
op (emitted by delegate/passes/fuse_linear.py: q/k/v of an attention, gate/up of an MLP). Its
weight is theirs concatenated along N (packed rows; scales columns, padded to 4 once, at the
end) and it writes one output per linear, [..., N_i], each the value that linear would give.

linear_q4gsw_swiglu is the gate/up pair of an MLP and its SwiGLU product silu(gate) * up as one
op (emitted by delegate/passes/linear_swiglu.py). Its weight holds the two linears' rows
interleaved (row 2j gate_j, row 2j + 1 up_j; N counts both), so a kernel thread that computes
one column also computes its partner; it writes only out [..., N/2] = g * sigmoid(g) * up,
rounded as the linears and then silu_mul would be.

linear_q4gsw_multi and linear_q4gsw_swiglu may also take the RMSNorm that feeds them (emitted by
delegate/passes/rms_norm_linear.py): a fourth input, the norm's weight w [K], and attribute
norm_eps (None: no norm, and then no fourth input). x is then the norm's input and the op
computes rms_norm(x, w, norm_eps) over K first, as the rms_norm op would, bit for bit; at
M == 1 the WebGPU GEMV does it in its prologue, so the norm costs no dispatch of its own.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from delegate.errors import DelegateError, expect
from delegate.ops import register_op
from delegate.ops.export import constant_value, register_pattern, target_name

DEQUANTIZE = "torchao.dequantize_affine.default"
LINEAR = "aten.linear.default"
GROUP_SIZES = (32, 64, 128, 256)
QMIN, QMAX = -8, 7


# ---- packing (export time) ---------------------------------------------------------------------
def pack_q4gsw(qdata: torch.Tensor, scale: torch.Tensor, group_size: int):
    """(packed int32 [N, K/8], scales float32 [K/gs, ceil4(N)]) from qdata [N, K] in [-8, 7]
    and torchao's scale [N, K/gs]."""
    n, k = qdata.shape
    nib = (qdata.to(torch.int32) + 8).to(torch.uint8)            # 0..15
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).contiguous()    # uint8 [N, K/2]
    scales = torch.zeros(k // group_size, -(-n // 4) * 4, dtype=torch.float32)
    scales[:, :n] = scale.reshape(n, k // group_size).to(torch.float32).t()
    return packed.view(torch.int32), scales


# ---- support -------------------------------------------------------------------------------------
def _arg(node, i: int, name: str, default=None):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _q4_args(dq):
    """(qdata node, block_size, scale node, zero_point node or None) of a dequantize_affine."""
    return dq.args[0], list(dq.args[1]), dq.args[2], _arg(dq, 3, "zero_point")


def why_not_q4gsw(dq) -> Optional[str]:
    """None when this dequantize_affine is a 4-bit group-symmetric weight we can pack."""
    qnode, block, snode, znode = _q4_args(dq)
    qdata, scale = constant_value(qnode), constant_value(snode)
    if qdata is None or scale is None:
        return "qdata and scale must be constant weights"
    if qdata.dtype != torch.int8 or qdata.dim() != 2:
        return f"qdata: expected int8 [N, K], got {qdata.dtype} {tuple(qdata.shape)}"
    n, k = qdata.shape
    dtype = _arg(dq, 4, "input_dtype")
    qmin, qmax = _arg(dq, 5, "quant_min"), _arg(dq, 6, "quant_max")
    if (dtype, qmin, qmax) != (torch.int8, QMIN, QMAX):
        return f"quantization: expected int8 in [{QMIN}, {QMAX}], got {dtype} in [{qmin}, {qmax}]"
    if _arg(dq, 7, "output_dtype", torch.float32) != torch.float32:
        return f"output dtype: expected torch.float32, got {_arg(dq, 7, 'output_dtype')}"
    if k % 8:
        return f"K: expected a multiple of 8, got {k}"
    gs = block[1] if len(block) == 2 and block[0] == 1 else None
    if gs not in GROUP_SIZES:
        return f"block size: expected [1, gs] with gs in {list(GROUP_SIZES)}, got {block}"
    if k % gs:
        return f"K: expected a multiple of the group size {gs}, got {k}"
    if scale.dtype != torch.float32 or scale.numel() != n * (k // gs):
        return (f"scale: expected float32 with {n}x{k // gs} values, "
                f"got {scale.dtype} {tuple(scale.shape)}")
    zero = None if znode is None else constant_value(znode)
    if znode is not None and zero is None:
        return "zero points must be a constant weight"
    return _value_check(qdata, zero)


# id(qdata) -> (weakref to qdata, weakref to zero or None, their versions, reason): the
# partitioner asks about every node several times, and a min/max over a 262M-entry LM head is
# not free. The weakrefs make a reused id (a freed tensor's address) a miss, never a stale hit.
_VALUE_CHECKS: dict = {}


def _value_check(qdata: torch.Tensor, zero) -> Optional[str]:
    versions = (qdata._version, None if zero is None else zero._version)
    hit = _VALUE_CHECKS.get(id(qdata))
    if (hit is not None and hit[0]() is qdata and versions == hit[2]
            and (None if hit[1] is None else hit[1]()) is zero):
        return hit[3]
    if zero is not None and bool(zero.ne(0).any()):
        why = "zero points: expected all 0 (symmetric), got nonzero values"
    elif int(qdata.min()) < QMIN or int(qdata.max()) > QMAX:
        why = (f"qdata: expected values in [{QMIN}, {QMAX}], "
               f"got [{int(qdata.min())}, {int(qdata.max())}]")
    else:
        why = None
    if len(_VALUE_CHECKS) > 1024:
        _VALUE_CHECKS.clear()
    _VALUE_CHECKS[id(qdata)] = (weakref.ref(qdata), None if zero is None else weakref.ref(zero),
                                versions, why)
    return why


EMBEDDING = "aten.embedding.default"


def _check_dequantize(dq) -> Optional[str]:
    """Folded: claimable only as the weight of linears (and embeddings, embedding_q4gsw in
    delegate/ops/embedding.py) that all take it as their weight."""
    for user in dq.users:
        name = target_name(user.target) if user.op == "call_function" else ""
        if name == LINEAR and user.args[1] is dq and user.args[0] is not dq and \
                _arg(user, 2, "bias") is not dq:
            continue
        if name == EMBEDDING and user.args[0] is dq and user.args[1] is not dq:
            continue
        return f"user {user.name}: expected aten.linear or aten.embedding reading it as weight"
    return why_not_q4gsw(dq)


def match_q4gsw_weight(w) -> Optional[str]:
    """None when the fx node `w` is a dequantize_affine we pack as q4gsw weights."""
    if getattr(w, "op", None) != "call_function" or target_name(w.target) != DEQUANTIZE:
        return "weight is not a torchao.dequantize_affine"
    return _check_dequantize(w)


def _match_linear(node) -> Optional[str]:
    """None when the linear's weight is a claimable dequantize_affine and x is float32 [..., K]."""
    w = node.args[1]
    why = match_q4gsw_weight(w)
    if why is not None:
        return why
    x = node.args[0].meta.get("val")
    k = w.meta["val"].shape[1]
    if x is None or x.dtype != torch.float32 or x.shape[-1] != k:
        return f"input: expected float32 [..., {k}], got {getattr(x, 'dtype', None)}"
    bias = _arg(node, 2, "bias")
    if bias is not None and bias.meta["val"].dtype != torch.float32:
        return f"bias: expected float32, got {bias.meta['val'].dtype}"
    return None


# ---- lowering and shapes -------------------------------------------------------------------
def q4gsw_weight(linear, weight_arg: int = 1) -> tuple:
    """(qdata int8 [N, K], scale [N, K/gs], gs) of a linear (or, weight_arg 0, an embedding)
    whose weight match_q4gsw_weight accepts."""
    qnode, block, snode, _ = _q4_args(linear.args[weight_arg])
    qdata = constant_value(qnode)
    return qdata, constant_value(snode).reshape(qdata.shape[0], -1), int(block[1])


def linear_bias(linear):
    return _arg(linear, 2, "bias")


def _lower_linear(ctx, node) -> None:
    lower_linear_residual(ctx, node)


def lower_linear_residual(ctx, linear, residual=None, out=None) -> None:
    """One linear_q4gsw for the fx `linear`; with a residual, it writes `out` (the fx add it
    absorbs) = linear + residual, and is lowered where that add stands."""
    qdata, scale, gs = q4gsw_weight(linear)
    n, k = qdata.shape
    packed, scales = pack_q4gsw(qdata, scale, gs)
    ins = [ctx.tensor(linear.args[0]), ctx.constant(packed), ctx.constant(scales),
           ctx.optional_tensor(linear_bias(linear))]
    if residual is not None:
        ins.append(ctx.tensor(residual))
    ctx.emit("linear_q4gsw", ins, [ctx.output(out if residual is not None else linear)],
             group_size=gs, K=int(k), N=int(n))


def _norm_operands(ctx, x, norm) -> tuple:
    """(inputs x and, with a norm, its weight; norm_eps) of a q4gsw op reading fx value `x`,
    or with norm = (norm input, norm weight, eps) the RMSNorm that makes x."""
    if norm is None:
        return [ctx.tensor(x)], [], None
    source, weight, eps = norm
    return [ctx.tensor(source)], [ctx.tensor(weight)], float(eps)


def lower_linear_multi(ctx, linears, norm=None) -> None:
    """One linear_q4gsw_multi for `linears` (the fx linears a pass grouped, in graph order:
    one x, equal K and group size, no bias), lowered where the first of them stands; with
    `norm` (_norm_operands) it also computes the RMSNorm that makes their x."""
    weights = [q4gsw_weight(linear) for linear in linears]
    gs, k = weights[0][2], int(weights[0][0].shape[1])
    widths = [int(q.shape[0]) for q, _, _ in weights]
    packed, scales = pack_q4gsw(torch.cat([q for q, _, _ in weights]),
                                torch.cat([s for _, s, _ in weights]), gs)
    x, w, eps = _norm_operands(ctx, linears[0].args[0], norm)
    ins = x + [ctx.constant(packed), ctx.constant(scales)] + w
    ctx.emit("linear_q4gsw_multi", ins, [ctx.output(linear) for linear in linears],
             group_size=gs, K=k, N=sum(widths), widths=widths, norm_eps=eps)


def interleave_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[2N, ...] with row 2j = a[j] and row 2j + 1 = b[j]."""
    return torch.stack([a, b], dim=1).reshape(2 * a.shape[0], *a.shape[1:])


def lower_linear_swiglu(ctx, gate, up, out, norm=None) -> None:
    """One linear_q4gsw_swiglu for the fx linears `gate` and `up` (one x, equal shapes, no
    bias) writing `out`, the fx node of silu(gate) * up, where it stands; with `norm`
    (_norm_operands) it also computes the RMSNorm that makes their x."""
    (qg, sg, gs), (qu, su, _) = q4gsw_weight(gate), q4gsw_weight(up)
    packed, scales = pack_q4gsw(interleave_rows(qg, qu), interleave_rows(sg, su), gs)
    x, w, eps = _norm_operands(ctx, gate.args[0], norm)
    ins = x + [ctx.constant(packed), ctx.constant(scales)] + w
    ctx.emit("linear_q4gsw_swiglu", ins, [ctx.output(out)], group_size=gs,
             K=int(qg.shape[1]), N=2 * int(qg.shape[0]), norm_eps=eps)


def _lower_nothing(ctx, node) -> None:
    """The linear_q4gsw pattern at each user reads the dequantize's qdata and scale itself."""


def _lower_swiglu_unreachable(ctx, node):
    # no targets: only delegate/passes/linear_swiglu.py emits it, through lower_linear_swiglu
    raise DelegateError(f"node {node.name}: expected linear_q4gsw_swiglu only from the "
                        f"linear_swiglu pass, got an edge node lowered as it")


def _infer_linear(in_shapes, attrs):
    x, packed, scales = in_shapes[0], in_shapes[1], in_shapes[2]
    bias = in_shapes[3] if len(in_shapes) > 3 else None
    residual = in_shapes[4] if len(in_shapes) > 4 else None
    k, n, gs = attrs["K"], attrs["N"], attrs["group_size"]
    expect(x is not None and len(x) >= 1 and x[-1] == k, DelegateError, "linear_q4gsw input",
           f"[..., {k}]", x)
    expect(tuple(packed) == (n, k // 8), DelegateError, "linear_q4gsw packed weight",
           (n, k // 8), tuple(packed))
    expect(tuple(scales) == (k // gs, -(-n // 4) * 4), DelegateError, "linear_q4gsw scales",
           (k // gs, -(-n // 4) * 4), tuple(scales))
    expect(bias is None or tuple(bias) == (n,), DelegateError, "linear_q4gsw bias", (n,), bias)
    out = tuple(x[:-1]) + (n,)
    expect(residual is None or tuple(residual) == out, DelegateError, "linear_q4gsw residual",
           out, residual)
    return [out]


def _check_norm(what: str, in_shapes, attrs) -> None:
    """A fused RMSNorm: a weight [K] as the fourth input exactly when norm_eps is set."""
    k, eps = attrs["K"], attrs.get("norm_eps")
    weight = in_shapes[3] if len(in_shapes) > 3 else None
    if eps is None:
        expect(len(in_shapes) == 3, DelegateError, f"{what} inputs without norm_eps",
               "x, packed, scales", f"{len(in_shapes)} inputs")
        return
    expect(weight is not None and tuple(weight) == (k,), DelegateError,
           f"{what} norm weight (norm_eps {eps})", (k,), weight)


def _infer_multi(in_shapes, attrs):
    _check_norm("linear_q4gsw_multi", in_shapes, attrs)
    x, packed, scales = in_shapes[:3]
    k, n, gs, widths = attrs["K"], attrs["N"], attrs["group_size"], attrs["widths"]
    expect(sum(widths) == n and all(w > 0 for w in widths), DelegateError,
           "linear_q4gsw_multi widths", f"positive, summing to N = {n}", widths)
    expect(x is not None and len(x) >= 1 and x[-1] == k, DelegateError,
           "linear_q4gsw_multi input", f"[..., {k}]", x)
    expect(tuple(packed) == (n, k // 8), DelegateError, "linear_q4gsw_multi packed weight",
           (n, k // 8), tuple(packed))
    expect(tuple(scales) == (k // gs, -(-n // 4) * 4), DelegateError,
           "linear_q4gsw_multi scales", (k // gs, -(-n // 4) * 4), tuple(scales))
    return [tuple(x[:-1]) + (w,) for w in widths]


def _infer_swiglu(in_shapes, attrs):
    _check_norm("linear_q4gsw_swiglu", in_shapes, attrs)
    x, packed, scales = in_shapes[:3]
    k, n, gs = attrs["K"], attrs["N"], attrs["group_size"]
    expect(n % 2 == 0 and n > 0, DelegateError, "linear_q4gsw_swiglu N",
           "a positive even count (gate and up rows interleaved)", n)
    expect(x is not None and len(x) >= 1 and x[-1] == k, DelegateError,
           "linear_q4gsw_swiglu input", f"[..., {k}]", x)
    expect(tuple(packed) == (n, k // 8), DelegateError, "linear_q4gsw_swiglu packed weight",
           (n, k // 8), tuple(packed))
    expect(tuple(scales) == (k // gs, -(-n // 4) * 4), DelegateError,
           "linear_q4gsw_swiglu scales", (k // gs, -(-n // 4) * 4), tuple(scales))
    return [tuple(x[:-1]) + (n // 2,)]


def _infer_dequantize(in_shapes, attrs):
    return [tuple(in_shapes[0])]


register_op("linear_q4gsw", (), _infer_linear, _lower_linear,
            doc="x @ dequant(W)^T + b (+ r, a fused residual add); W packed 4-bit [N, K/2], "
                "fp32 scales per group of K",
            attrs={"group_size": "int", "K": "int", "N": "int"}, arity=((4, 5), 1))
register_op("linear_q4gsw_multi", (), _infer_multi, lower_linear_multi,
            doc="x @ dequant(W_i)^T for 2 or 3 bias-free q4gsw linears of one x, their weights "
                "concatenated along N, one output each (fused q/k/v, gate/up); with norm_eps, "
                "x is first rms_norm(x, w, norm_eps), w the fourth input",
            attrs={"group_size": "int", "K": "int", "N": "int", "widths": "ints",
                   "norm_eps": "float?"},
            arity=((3, 4), (2, 3)))
register_op("linear_q4gsw_swiglu", (), _infer_swiglu, _lower_swiglu_unreachable,
            doc="silu(x @ dequant(W_gate)^T) * (x @ dequant(W_up)^T), the two bias-free q4gsw "
                "linears' rows interleaved (fused gate/up and SwiGLU); with norm_eps, x is "
                "first rms_norm(x, w, norm_eps), w the fourth input",
            attrs={"group_size": "int", "K": "int", "N": "int", "norm_eps": "float?"},
            arity=((3, 4), 1))
register_op("dequantize_affine_q4", (DEQUANTIZE,), _infer_dequantize, _lower_nothing,
            check=_check_dequantize, folded=True, attrs={}, arity=(0, 0),
            doc="torchao int4 per-group dequantize; folded into the linear_q4gsw that reads it")
register_pattern("linear_q4gsw", LINEAR, _match_linear, _lower_linear,
                 doc="torchao.dequantize_affine (int4, [1, gs], zero points 0) -> aten.linear")

"""Elementwise CPU kernels: torch's out= ops on disjoint chunks of the output. torch promotes
mixed operands (integers, bool, float32) into the output's dtype, which is the ops' definition
(delegate/ops/elementwise.py).

Large outputs are split along one dim across the pool; inputs are broadcast (expanded, never
copied) to the output shape first so every chunk is the same narrow() of each operand.
"""
from __future__ import annotations

import torch

from kernels_cpu import register_kernel
from kernels_cpu.threadpool import get_pool

aten = torch.ops.aten

# Below this many elements (1 MiB of float32, ~100 us of memory-bound work) a pool dispatch
# costs more than it saves.
PARALLEL_NUMEL = 1 << 18


def _split_dim(shape, workers: int) -> int:
    """The outermost dim that gives every worker a share, else the largest dim."""
    for d, s in enumerate(shape):
        if s >= workers:
            return d
    return max(range(len(shape)), key=lambda d: shape[d])


def map_chunks(fn, out: torch.Tensor, *operands) -> None:
    """fn(out_chunk, *operand_chunks) over disjoint chunks of `out`; operands broadcast to out.

    Non-tensor operands (scalars) pass through unchanged.
    """
    pool = get_pool()
    if out.numel() < PARALLEL_NUMEL or pool.num_threads == 1 or out.dim() == 0:
        fn(out, *operands)
        return
    shape = tuple(out.shape)
    expanded = [t.expand(shape) if isinstance(t, torch.Tensor) else t for t in operands]
    d = _split_dim(shape, pool.num_threads)
    row = out.numel() // shape[d]
    min_chunk = max(1, (PARALLEL_NUMEL // 2) // max(row, 1))

    def work(_w, a, b):
        chunks = [t.narrow(d, a, b - a) if isinstance(t, torch.Tensor) else t for t in expanded]
        fn(out.narrow(d, a, b - a), *chunks)

    pool.parallel_for(shape[d], work, min_chunk=min_chunk)


def _binary(torch_fn, with_alpha: bool):
    def kernel(ins, outs, attrs, scratch):
        b = ins[1] if len(ins) > 1 and ins[1] is not None else attrs["other"]
        if with_alpha:
            alpha = attrs.get("alpha", 1)   # an int for integer results: torch refuses a float
            map_chunks(lambda o, x, y: torch_fn(x, y, alpha=alpha, out=o), outs[0], ins[0], b)
        else:
            map_chunks(lambda o, x, y: torch_fn(x, y, out=o), outs[0], ins[0], b)

    return kernel


register_kernel("add")(_binary(torch.add, True))
register_kernel("sub")(_binary(torch.sub, True))
register_kernel("mul")(_binary(torch.mul, False))
register_kernel("div")(_binary(torch.div, False))


def _unary(out_fn):
    def kernel(ins, outs, attrs, scratch):
        map_chunks(lambda o, x: out_fn(x, o), outs[0], ins[0])

    return kernel


for _name, _fn in (
    ("neg", lambda x, o: torch.neg(x, out=o)),
    ("exp", lambda x, o: torch.exp(x, out=o)),
    ("sigmoid", lambda x, o: torch.sigmoid(x, out=o)),
    ("relu", lambda x, o: aten.relu.out(x, out=o)),
    ("tanh", lambda x, o: torch.tanh(x, out=o)),
    ("rsqrt", lambda x, o: torch.rsqrt(x, out=o)),
    ("silu", lambda x, o: aten.silu.out(x, out=o)),
    ("abs", lambda x, o: torch.abs(x, out=o)),
    ("sqrt", lambda x, o: torch.sqrt(x, out=o)),
    ("log", lambda x, o: torch.log(x, out=o)),
    ("log1p", lambda x, o: torch.log1p(x, out=o)),
    ("ceil", lambda x, o: torch.ceil(x, out=o)),
    ("floor", lambda x, o: torch.floor(x, out=o)),
    ("sin", lambda x, o: torch.sin(x, out=o)),
    ("cos", lambda x, o: torch.cos(x, out=o)),
    ("hardswish", lambda x, o: aten.hardswish.out(x, out=o)),
    ("hardsigmoid", lambda x, o: aten.hardsigmoid.out(x, out=o)),
):
    register_kernel(_name)(_unary(_fn))


@register_kernel("gelu")
def gelu(ins, outs, attrs, scratch):
    approx = attrs.get("approximate") or "none"
    map_chunks(lambda o, x: aten.gelu.out(x, approximate=approx, out=o), outs[0], ins[0])


@register_kernel("pow")
def pow_scalar(ins, outs, attrs, scratch):
    e = attrs["exponent"]
    map_chunks(lambda o, x: torch.pow(x, e, out=o), outs[0], ins[0])


@register_kernel("clamp")
def clamp(ins, outs, attrs, scratch):
    lo, hi = attrs.get("min"), attrs.get("max")
    map_chunks(lambda o, x: torch.clamp(x, lo, hi, out=o), outs[0], ins[0])


@register_kernel("leaky_relu")
def leaky_relu(ins, outs, attrs, scratch):
    slope = attrs["negative_slope"]
    map_chunks(lambda o, x: aten.leaky_relu.out(x, slope, out=o), outs[0], ins[0])


@register_kernel("elu")
def elu(ins, outs, attrs, scratch):
    a, s, i = attrs["alpha"], attrs["scale"], attrs["input_scale"]
    map_chunks(lambda o, x: aten.elu.out(x, a, s, i, out=o), outs[0], ins[0])


def silu_mul_chunk(o, gate, up) -> None:
    """One chunk of silu(gate) * up: silu into o, then times up in place, so each chunk is
    read while it is still in cache (gate may be o itself). linear_q4gsw_swiglu runs it too."""
    aten.silu.out(gate, out=o)
    o.mul_(up)


@register_kernel("silu_mul")
def silu_mul(ins, outs, attrs, scratch):
    """silu(gate) * up (delegate/ops/silu_mul.py), chunk by chunk."""
    map_chunks(silu_mul_chunk, outs[0], ins[0], ins[1])

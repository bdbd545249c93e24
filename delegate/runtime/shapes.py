"""Per-execute shape inference shared by the executors: bind symbols from the live inputs,
check the inputs against the graph, and resolve symbolic attributes."""
from __future__ import annotations

import torch

from delegate import symexpr
from delegate.errors import InputError
from delegate.ir import Graph, SymExpr, TensorValue


def bind_inputs(graph: Graph, inputs: list) -> dict:
    """Check count, dtype, rank and every dim of the inputs; return the symbol environment."""
    if len(inputs) != len(graph.inputs):
        raise InputError(f"input count: expected {len(graph.inputs)}, got {len(inputs)}")
    env = {}
    for s in graph.symbols:
        t = inputs[s.input]
        if s.dim == -1 and isinstance(t, (int, torch.SymInt)) and not isinstance(t, bool):
            env[s.name] = int(t)
        elif isinstance(t, torch.Tensor) and t.dim() > s.dim >= 0:
            env[s.name] = int(t.shape[s.dim])
        elif isinstance(t, torch.Tensor) and s.dim < 0 and 0 <= s.element < t.numel() \
                and not t.is_floating_point() and not t.is_complex():
            env[s.name] = int(t.reshape(-1)[s.element])
    for i, (vid, t) in enumerate(zip(graph.inputs, inputs)):
        spec = graph.values[vid]
        if isinstance(spec, TensorValue):
            _check_input(i, spec, t, env)
        elif spec.kind == "int" and (isinstance(t, bool) or not isinstance(t, int)):
            raise InputError(f"input {i}: expected an int, got {type(t).__name__}")
    return env


def symbol_value(s, inputs: list) -> int:
    """The live value of one symbol: a dim of its input, or (dim < 0) an element of it."""
    t = inputs[s.input]
    if s.dim >= 0:
        return int(t.shape[s.dim])
    if isinstance(t, torch.Tensor):
        return int(t.reshape(-1)[s.element])
    return int(t)


def check_tensor_kind(what: str, t, dtype: torch.dtype, rank: int) -> None:
    """A dense CPU tensor of this dtype and rank, else InputError; the runner and executors
    share it. Any strides are fine (inputs are copied in), so views and channels_last work."""
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{what}: expected a {dtype} tensor, got {type(t).__name__}")
    kind = _odd_kind(t)
    if kind:
        raise InputError(f"{what}: expected a dense CPU {dtype} tensor, got {kind}")
    if t.dtype != dtype:
        raise InputError(f"{what} dtype: expected {dtype}, got {t.dtype}")
    if t.dim() != rank:
        raise InputError(f"{what} rank: expected {rank}, got {t.dim()}")


def _odd_kind(t: torch.Tensor) -> str:
    """What makes t other than a dense CPU tensor whose bytes can be read, or ""."""
    # the common case in ~0.5 µs (each execute checks every input; t.device and a Python
    # walk of the strides cost 0.3-0.5 µs each): contiguous strides are never negative
    if (t.is_cpu and t.layout is torch.strided and not t.is_nested and not t.is_quantized
            and t.is_contiguous()):
        return ""
    if t.is_nested:
        return "a nested tensor"
    if t.layout != torch.strided:
        return f"a {str(t.layout).removeprefix('torch.')} tensor"
    if t.is_quantized:
        return f"a quantized tensor ({t.dtype})"
    if t.device.type != "cpu":
        return f"a tensor on device {t.device}"
    if any(s < 0 for s in t.stride()):
        return f"a tensor with negative strides {tuple(t.stride())}"
    return ""


def _check_input(i: int, spec: TensorValue, t, env: dict) -> None:
    check_tensor_kind(f"input {i}", t, spec.dtype, len(spec.dims))
    want = tuple(symexpr.resolve(d, env) for d in spec.dims)
    got = tuple(t.shape)
    if want != got:
        raise InputError(f"input {i} shape: expected {_describe(spec)} = {want}, got {got}")
    for d, (size, bound) in enumerate(zip(got, spec.max_shape)):
        if size > bound:
            raise InputError(f"input {i} dim {d}: expected at most {bound}, got {size}")


def _describe(spec: TensorValue) -> str:
    return "(" + ", ".join(str(d) for d in spec.dims) + ")"


def live_shape(spec: TensorValue, env: dict) -> tuple:
    return tuple(symexpr.resolve(d, env) for d in spec.dims)


def has_symbols(attrs: dict) -> bool:
    return any(
        isinstance(v, SymExpr) or (isinstance(v, list) and any(isinstance(e, SymExpr) for e in v))
        for v in attrs.values()
    )

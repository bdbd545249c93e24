"""Static views of a .pte for the CLI: methods, delegates, their ops, the device each would
run on, and random inputs matching a method's input specs."""
from __future__ import annotations

import torch

from delegate import blob
from delegate.errors import ProgramError
from delegate.runtime.wgpu_backend import WgpuRuntimeBackend, choose_device


def _pte(data: bytes):
    from delegate.runtime.program import read_pte

    return read_pte(data)


def describe_program(data: bytes, device: str = "auto") -> str:
    pte = _pte(data)
    program = pte.program
    lines = [f".pte: {len(data)} bytes, {len(program.execution_plan)} method(s)"]
    for plan in program.execution_plan:
        lines.append(f"method {plan.name}: {len(plan.inputs)} input(s), {len(plan.outputs)} output(s)")
        for i, vid in enumerate(plan.inputs):
            lines.append(f"  input {i}: {_spec(plan.values[vid].val)}")
        kernels = sorted({f"{o.name}.{o.overload}" for o in plan.operators})
        lines.append(f"  kernel calls (ATen): {', '.join(kernels) or 'none'}")
        for k, d in enumerate(plan.delegates):
            lines.extend(_describe_delegate(k, d, program, device))
    return "\n".join(lines)


def _describe_delegate(k, d, program, device) -> list:
    head = f"  delegate {k}: backend {d.id}"
    if d.id != WgpuRuntimeBackend.backend_id:
        return [head]
    graph = blob.decode(program.backend_delegate_data[d.processed.index].data)
    ops = {}
    for n in graph.nodes:
        ops[n.op] = ops.get(n.op, 0) + 1
    try:
        chosen = choose_device(device, graph)
    except Exception as e:  # inspect reports a device it cannot use instead of failing
        chosen = f"unavailable ({e})"
    table = ", ".join(f"{op} x{c}" if c > 1 else op for op, c in ops.items())
    return [f"{head}, device {chosen}", f"    {len(graph.nodes)} node(s): {table}"]


def _spec(val) -> str:
    if hasattr(val, "sizes"):
        dyn = "" if int(val.shape_dynamism) == 0 else " (dynamic, upper bounds)"
        return f"tensor {_dtype(val.scalar_type)} {list(val.sizes)}{dyn}"
    return type(val).__name__


def _dtype(scalar_type) -> torch.dtype:
    from executorch.exir.scalar_type import ScalarType

    table = {ScalarType.FLOAT: torch.float32, ScalarType.HALF: torch.float16,
             ScalarType.BFLOAT16: torch.bfloat16, ScalarType.DOUBLE: torch.float64,
             ScalarType.LONG: torch.int64, ScalarType.INT: torch.int32,
             ScalarType.SHORT: torch.int16, ScalarType.CHAR: torch.int8,
             ScalarType.BYTE: torch.uint8, ScalarType.BOOL: torch.bool}
    return table[ScalarType(int(scalar_type))]


def random_inputs(data: bytes, method: str) -> list:
    """Inputs at each tensor's planned (upper-bound) size: floats ~ N(0,1), ints in [0, 8)."""
    plans = {p.name: p for p in _pte(data).program.execution_plan}
    if method not in plans:
        raise ProgramError(f"method: expected one of {sorted(plans)}, got {method!r}")
    out = []
    g = torch.Generator().manual_seed(0)
    for vid in plans[method].inputs:
        val = plans[method].values[vid].val
        dtype = _dtype(val.scalar_type)
        shape = tuple(val.sizes)
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=g).bool())
        else:
            out.append(torch.randint(0, 8, shape, generator=g).to(dtype))
    return out

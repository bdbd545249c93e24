"""Static views of a .pte for the CLI: methods, delegates, their ops, the ATen kernels left
outside the delegates, the device each delegate would run on, and random inputs matching a
method's input specs."""
from __future__ import annotations

from collections import Counter

import torch

from delegate import blob
from delegate.errors import ProgramError
from delegate.runtime.wgpu_backend import WgpuRuntimeBackend, choose_device


def _pte(data: bytes):
    from delegate.runtime.program import read_pte

    return read_pte(data)


def pick_method(names, requested: str | None) -> str:
    """The method a verb runs: the one asked for, else "forward", else the first by name."""
    names = sorted(names)
    if requested is None:
        if not names:
            raise ProgramError("methods: expected at least one in the .pte, got none")
        return "forward" if "forward" in names else names[0]
    if requested not in names:
        raise ProgramError(f"method: expected one of {names}, got {requested!r}")
    return requested


def describe_program(data: bytes, device: str = "auto", method: str | None = None) -> str:
    """Every method of the .pte, or only `method` when it is given."""
    program = _pte(data).program
    plans = program.execution_plan
    if method is not None:
        name = pick_method([p.name for p in plans], method)
        plans = [p for p in plans if p.name == name]
    lines = [f".pte: {len(data)} bytes, {len(program.execution_plan)} method(s)"]
    for plan in plans:
        lines.append(f"method {plan.name}: {len(plan.inputs)} input(s), {len(plan.outputs)} output(s)")
        for i, vid in enumerate(plan.inputs):
            lines.append(f"  input {i}: {_spec(plan.values[vid].val)}")
        for k, d in enumerate(plan.delegates):
            lines.extend(_describe_delegate(k, d, program, device))
        lines.extend(outside_summary(plan, program))
    return "\n".join(lines)


def delegation(plan, program) -> tuple:
    """(ops in our delegates, ATen kernel calls outside, delegate calls) of one method: a
    delegate's ops are its IR nodes (a batch norm folded into its convolution is none)."""
    n_out = sum(kernel_calls(plan).values())
    n_in = sum(len(_graph(d, program).nodes) for d in plan.delegates
               if d.id == WgpuRuntimeBackend.backend_id)
    calls = sum(type(ins.instr_args).__name__ == "DelegateCall"
                for chain in plan.chains or [] for ins in chain.instructions)
    return n_in, n_out, calls


def _method_plan(data: bytes, method: str | None) -> tuple:
    """(execution plan of `method`, or of the one method there is; the program) of a .pte."""
    program = _pte(data).program
    plans = {p.name: p for p in program.execution_plan}
    return plans[pick_method(plans, method)], program


def delegation_of(data: bytes, method: str | None = None) -> tuple:
    """`delegation` of one method of a .pte."""
    return delegation(*_method_plan(data, method))


def outside_summary(plan, program) -> list:
    """How many of a method's ops (delegated IR nodes plus kernel calls) its delegate calls
    hold, and the ATen kernel calls left outside, each with its share of the ops."""
    outside = kernel_calls(plan)
    n_in, n_out, calls = delegation(plan, program)
    total = n_in + n_out
    lines = [f"  delegated: {n_in} of {total} op(s), in {calls} delegate call(s)",
             f"  ATen kernels outside the delegates: "
             + (f"{n_out} of {total} op(s) ({n_out / total:.1%})" if n_out else "none")]
    for label, n in outside.most_common():
        lines.append(f"    {label:<40} x{n:<4} {n / total:>6.1%}")
    return lines


def describe_outside(data: bytes, method: str | None = None) -> str:
    """outside_summary of one method of a .pte (the demo prints it for what it lowered)."""
    return "\n".join(outside_summary(*_method_plan(data, method)))


def kernel_calls(plan) -> Counter:
    """Operator label ("aten::add.out") -> number of KernelCall instructions running it."""
    counts: Counter = Counter()
    for chain in plan.chains or []:
        for ins in chain.instructions:
            a = ins.instr_args
            if type(a).__name__ == "KernelCall" and 0 <= a.op_index < len(plan.operators):
                op = plan.operators[a.op_index]
                counts[f"{op.name}.{op.overload}" if op.overload else op.name] += 1
    return counts


def _graph(d, program):
    return blob.decode(program.backend_delegate_data[d.processed.index].data)


def _describe_delegate(k, d, program, device) -> list:
    head = f"  delegate {k}: backend {d.id}"
    if d.id != WgpuRuntimeBackend.backend_id:
        return [head]
    graph = _graph(d, program)
    ops = Counter(n.op for n in graph.nodes)
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
    """Inputs at each tensor's planned (upper-bound) size: floats ~ N(0,1), ints in [0, 8);
    scalar inputs at the value they were specialised to."""
    plans = {p.name: p for p in _pte(data).program.execution_plan}
    plan = plans[pick_method(plans, method)]
    out = []
    g = torch.Generator().manual_seed(0)
    for vid in plan.inputs:
        val = plan.values[vid].val
        if not hasattr(val, "sizes"):  # a scalar input was specialised at export: pass it back
            out.append(next((getattr(val, f) for f in ("int_val", "double_val", "bool_val")
                             if hasattr(val, f)), None))
            continue
        dtype = _dtype(val.scalar_type)
        shape = tuple(val.sizes)
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=g).bool())
        else:
            out.append(torch.randint(0, 8, shape, generator=g).to(dtype))
    return out

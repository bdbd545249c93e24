"""Profiles of a .pte method: `python -m delegate profile model.pte`.

Inside the delegates, an executor that offers `execute_profiled(inputs) -> (outputs,
[(label, seconds)], clock)` is timed per dispatch or node: WebGPU runs each dispatch in its own
compute pass bracketed by timestamp queries when the adapter offers them ("gpu"), otherwise it
waits on each ("wall"). A delegate without it is timed whole. Outside the delegates, every
instruction the runner runs is timed (Method.time_instructions), so the ATen kernels left
outside show with their share. Times are means over `runs` executes after one warm-up; shares
are of the method's mean wall time.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

from delegate.runtime.inspect import pick_method, random_inputs
from delegate.runtime.program import Runtime, read_source

_CLOCKS = {"gpu": "GPU timestamps", "wall": "wall time"}
# Instruction kinds that are not kernel calls (a KernelCall is labelled by its operator).
_NOT_KERNELS = ("DelegateCall", "MoveCall", "JumpFalseCall", "FreeCall")


def profile_method(program_path, method: str | None = None, device: str = "webgpu",
                   inputs=None, runs: int = 10) -> str:
    data = read_source(program_path)
    prog = Runtime.get().load_program(data, device=device)
    try:
        name = pick_method(prog.method_names, method)
        m = prog.load_method(name)
        inputs = list(inputs) if inputs is not None else random_inputs(data, name)
        m.execute(inputs)                      # warm-up: first-use compilation, page-in
        steps: list = []                       # per run: [(pc, label, seconds)]
        dispatches: list = []                  # per run: [(delegate, label, seconds, clock)]
        with _instrumented(m, steps, dispatches):
            walls = _timed_runs(m, inputs, runs, (steps, dispatches))
        return "\n".join(_report(name, device, steps, dispatches, walls))
    finally:
        prog.destroy()


def outside_delegates(method, inputs, runs: int = 3) -> list:
    """Lines for the ATen kernels `method` runs outside its delegates, timed over `runs`
    executes, each with its share of the method's mean wall time."""
    steps: list = []
    with _instrumented(method, steps):
        walls = _timed_runs(method, inputs, runs, (steps,))
    kernels = {k: v for k, v in _mean_by_label(steps).items() if k not in _NOT_KERNELS}
    return _outside_table(kernels, sum(walls) / len(walls))


def _timed_runs(method, inputs, runs: int, logs) -> list:
    """Wall seconds of each of `runs` executes; each log gets one fresh list per run."""
    walls = []
    for _ in range(max(1, runs)):
        for log in logs:
            log.append([])
        t0 = time.perf_counter()
        method.execute(inputs)
        walls.append(time.perf_counter() - t0)
    return walls


@contextmanager
def _instrumented(method, steps: list, dispatches: list | None = None):
    """Time each instruction into steps and, with dispatches, each delegate's dispatches
    where its executor can."""
    handles = [handle for _, handle in method.delegates] if dispatches is not None else []
    for index, handle in enumerate(handles):
        if hasattr(handle, "execute_profiled"):
            handle.execute = _profiled(index, handle, dispatches)
    undo = method.time_instructions(lambda pc, label, sec: steps[-1].append((pc, label, sec)))
    try:
        yield
    finally:
        undo()
        for h in handles:
            h.__dict__.pop("execute", None)


def _profiled(index: int, handle, dispatches: list):
    """An execute that records the executor's per-dispatch times; the runner stores the
    returned outputs into its planned tensors."""
    def run(inputs, outputs=None):
        del handle.execute             # unshadowed while it runs: it may call its own execute
        try:
            outs, times, clock = handle.execute_profiled(inputs)
        finally:
            handle.execute = run
        dispatches[-1].extend((index, label, sec, clock) for label, sec in times)
        return outs
    return run


def _report(method: str, device: str, steps: list, dispatches: list, walls: list) -> list:
    runs, wall = len(walls), sum(walls) / len(walls)
    per_dispatch = defaultdict(float)      # (position, delegate, label, clock) -> seconds
    for run in dispatches:
        for pos, (d, label, sec, clock) in enumerate(run):
            per_dispatch[(pos, d, label, clock)] += sec / runs
    clocks = sorted({k[3] for k in per_dispatch})
    inside = " + ".join(_CLOCKS[c] for c in clocks) or "wall time, each delegate call whole"
    lines = [f"profile of {method!r} on {device}: {runs} runs after a warm-up; inside the "
             f"delegates, times are {inside}; shares are of the method's mean wall time", ""]
    if per_dispatch:
        lines += _dispatch_tables(per_dispatch, wall)
    else:
        lines += _whole_delegates(steps, wall)
    by_label = _mean_by_label(steps)
    kernels = {k: v for k, v in by_label.items() if k not in _NOT_KERNELS}
    lines += [""] + _outside_table(kernels, wall)
    delegated = by_label.get("DelegateCall", (0, 0.0))[1]
    outside = sum(sec for _, sec in kernels.values())
    runner = max(0.0, wall - delegated - outside)
    lines += ["", f"total per run (the method's wall time): {min(walls) * 1e3:.3f} ms min, "
                  f"{wall * 1e3:.3f} ms mean (profiling adds overhead): "
                  f"delegate calls {_ms_share(delegated, wall)}, "
                  f"ATen kernels {_ms_share(outside, wall)}, "
                  f"runner (inputs, outputs, moves) {_ms_share(runner, wall)}"]
    return lines


def _dispatch_tables(per_dispatch: dict, wall: float) -> list:
    lines = ["inside the delegates, per dispatch or node:",
             f"{'#':>4}  {'delegate':>8}  {'kernel [op or source node]':<36} {'ms':>10}  clock"]
    for (pos, d, label, clock), sec in sorted(per_dispatch.items()):
        lines.append(f"{pos:>4}  {d:>8}  {label:<36} {sec * 1e3:>10.4f}  {clock}")
    groups = defaultdict(lambda: [0, 0.0])
    for (_, _, label, clock), sec in per_dispatch.items():
        g = groups[(label.split(" [")[0], clock)]
        g[0] += 1
        g[1] += sec
    lines += ["", f"{'kernel':<36} {'dispatches':>10} {'ms/run':>10} {'share':>7}  clock"]
    for (kernel, clock), (n, sec) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{kernel:<36} {n:>10} {sec * 1e3:>10.4f} {_share(sec, wall):>7}  {clock}")
    return lines


def _whole_delegates(steps: list, wall: float) -> list:
    """Delegates whose executor cannot time its nodes: one row per delegate call."""
    per_call = defaultdict(float)
    for run in steps:
        for pc, label, sec in run:
            if label == "DelegateCall":
                per_call[pc] += sec / len(steps)
    lines = ["inside the delegates (the executor does not time its nodes):",
             f"{'instruction':<36} {'ms/run':>10} {'share':>7}"]
    for pc, sec in sorted(per_call.items()):
        label = f"{pc} DelegateCall (whole)"
        lines.append(f"{label:<36} {sec * 1e3:>10.4f} {_share(sec, wall):>7}")
    return lines


def _mean_by_label(steps: list) -> dict:
    """instruction label -> (calls per run, mean seconds per run) over the timed runs."""
    out = defaultdict(lambda: [0, 0.0])
    for run in steps:
        for _, label, sec in run:
            out[label][0] += 1
            out[label][1] += sec
    return {k: (n // len(steps), sec / len(steps)) for k, (n, sec) in out.items()}


def _outside_table(kernels: dict, wall: float) -> list:
    """kernels: operator label -> (calls per run, seconds per run)."""
    if not kernels:
        return ["ATen kernels outside the delegates: none"]
    total = sum(sec for _, sec in kernels.values())
    lines = [f"ATen kernels outside the delegates: {_ms_share(total, wall)}",
             f"{'kernel':<36} {'calls':>10} {'ms/run':>10} {'share':>7}"]
    for label, (n, sec) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{label:<36} {n:>10} {sec * 1e3:>10.4f} {_share(sec, wall):>7}")
    return lines


def _share(sec: float, wall: float) -> str:
    return f"{sec / wall:.1%}" if wall else "-"


def _ms_share(sec: float, wall: float) -> str:
    return f"{sec * 1e3:.3f} ms ({_share(sec, wall)})"

"""Per-dispatch profiles of a .pte method: `python -m delegate profile model.pte`.

WebGPU delegates run each dispatch in its own compute pass bracketed by timestamp queries when
the adapter offers them (GPU time), otherwise they wait on each dispatch (wall time, labelled
so). Delegates of other executors are timed whole. Times are means over `runs` executes after
one warm-up, listed per dispatch and grouped by kernel, with totals.
"""
from __future__ import annotations

import time
from collections import defaultdict

from delegate.runtime.inspect import random_inputs
from delegate.runtime.program import Runtime, read_source


def profile_method(program_path, method: str = "forward", device: str = "webgpu",
                   inputs=None, runs: int = 10) -> str:
    data = read_source(program_path)
    prog = Runtime.get().load_program(data, device=device)
    try:
        m = prog.load_method(method)
        inputs = list(inputs) if inputs is not None else random_inputs(data, method)
        m.execute(inputs)                      # warm-up: first-use compilation, page-in
        records: list = []                     # per run: [(delegate, label, seconds, clock)]
        restore = _instrument(m, records)
        try:
            walls = []
            for _ in range(max(1, runs)):
                records.append([])
                t0 = time.perf_counter()
                m.execute(inputs)
                walls.append(time.perf_counter() - t0)
        finally:
            restore()
        return _report(method, device, records, walls)
    finally:
        prog.destroy()


def _instrument(method, records: list):
    """Shadow each delegate handle's execute with a timed one; returns the undo."""
    handles = [handle for _, handle in method.delegates]
    for index, handle in enumerate(handles):
        handle.execute = _timed(index, handle, handle.execute, records)
    return lambda: [h.__dict__.pop("execute", None) for h in handles]


def _timed(index: int, handle, original, records: list):
    def run(inputs, outputs=None):   # profiled outputs are fresh tensors; the runner copies
        if hasattr(handle, "execute_profiled"):
            outs, times, clock = handle.execute_profiled(inputs)
            records[-1].extend((index, label, sec, clock) for label, sec in times)
            return outs
        t0 = time.perf_counter()
        outs = original(inputs, outputs)
        name = f"{getattr(handle, 'device', type(handle).__name__)} delegate (whole)"
        records[-1].append((index, name, time.perf_counter() - t0, "wall"))
        return outs

    return run


def _report(method: str, device: str, records: list, walls: list) -> str:
    runs = len(records)
    per_dispatch = defaultdict(float)      # (position, delegate, label, clock) -> seconds
    for run in records:
        for pos, (d, label, sec, clock) in enumerate(run):
            per_dispatch[(pos, d, label, clock)] += sec / runs
    clocks = sorted({k[3] for k in per_dispatch}) or ["none"]
    lines = [f"profile of {method!r} on {device}: {runs} runs after a warm-up; "
             f"times are {' + '.join(_CLOCKS[c] for c in clocks)}", "",
             f"{'#':>4}  {'delegate':>8}  {'kernel [op]':<36} {'ms':>10}  clock"]
    for (pos, d, label, clock), sec in sorted(per_dispatch.items()):
        lines.append(f"{pos:>4}  {d:>8}  {label:<36} {sec * 1e3:>10.4f}  {clock}")
    groups = defaultdict(lambda: [0, 0.0])
    for (_, _, label, clock), sec in per_dispatch.items():
        g = groups[(label.split(" [")[0], clock)]
        g[0] += 1
        g[1] += sec
    total = sum(sec for sec in per_dispatch.values())
    lines += ["", f"{'kernel':<28} {'dispatches':>10} {'ms/run':>10} {'share':>7}  clock"]
    for (kernel, clock), (n, sec) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        share = sec / total if total else 0.0
        lines.append(f"{kernel:<28} {n:>10} {sec * 1e3:>10.4f} {share:>6.1%}  {clock}")
    lines += ["", f"total per run: {total * 1e3:.4f} ms in {len(per_dispatch)} timed items; "
                  f"method wall time {min(walls) * 1e3:.3f} ms min, "
                  f"{sum(walls) / len(walls) * 1e3:.3f} ms mean (profiling adds overhead)"]
    return "\n".join(lines)


_CLOCKS = {"gpu": "GPU timestamps", "wall": "wall time (no GPU timestamps)", "none": "none"}

"""python -m delegate {inspect,run,profile,demo}."""
from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings

import torch

from delegate.errors import DelegateError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m delegate", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, fn in (("inspect", cmd_inspect), ("run", cmd_run), ("profile", cmd_profile)):
        s = sub.add_parser(name)
        s.add_argument("pte")
        s.add_argument("--device", default="auto", choices=("auto", "webgpu", "cpu"))
        s.add_argument("--method", default=None)
        s.set_defaults(fn=fn)
        if name != "inspect":
            s.add_argument("--inputs", help="a torch.save'd list of input tensors")
            s.add_argument("--runs", type=int, default=10)
    d = sub.add_parser("demo", help="export, lower, save and run a small transformer")
    d.add_argument("--out", default="tiny_transformer.pte")
    d.add_argument("--device", default="auto", choices=("auto", "webgpu", "cpu"))
    d.add_argument("--runs", type=int, default=10)
    d.set_defaults(fn=cmd_demo)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # torchao (imported by executorch) warns about its own enum registration at import time.
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    logging.getLogger("torchao").setLevel(logging.ERROR)
    # torch.export's pytree deprecation notice, raised inside ExecuTorch's lowering.
    warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")
    try:
        return args.fn(args) or 0
    except DelegateError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


def cmd_inspect(args) -> int:
    from delegate.runtime.inspect import describe_program

    print(describe_program(_read(args.pte), device=args.device))
    return 0


def cmd_run(args) -> int:
    from delegate.runtime.inspect import random_inputs
    from delegate.runtime.program import Runtime

    prog = Runtime.get().load_program(_read(args.pte), device=args.device)
    try:
        name = args.method or sorted(prog.method_names)[0]
        method = prog.load_method(name)
        inputs = torch.load(args.inputs) if args.inputs else random_inputs(_read(args.pte), name)
        outs, ms = timed(lambda: method.execute(inputs), args.runs)
        for i, o in enumerate(outs):
            desc = f"{tuple(o.shape)} {o.dtype}" if isinstance(o, torch.Tensor) else repr(o)
            print(f"output {i}: {desc}")
        print(f"{name}: {ms:.3f} ms/run (min of {args.runs})")
    finally:
        prog.destroy()
    return 0


def cmd_profile(args) -> int:
    from delegate.runtime.profile import profile_method

    print(profile_method(args.pte, method=args.method or "forward", device=args.device,
                         inputs=torch.load(args.inputs) if args.inputs else None, runs=args.runs))
    return 0


def cmd_demo(args) -> int:
    from delegate.demo import run_demo

    run_demo(args.out, device=args.device, runs=args.runs)
    return 0


def timed(fn, runs: int):
    """(last result, min milliseconds over `runs` calls after one warm-up)."""
    out = fn()
    best = float("inf")
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best * 1e3


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        from delegate.errors import ProgramError

        raise ProgramError(f"{path}: expected a readable .pte file, got {e.strerror}") from e

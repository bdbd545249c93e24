"""python -m delegate: look into, run and profile a .pte on etwgpu's runner, list the ops the
delegate implements, or run the demo. Every error is one line, `error: <DelegateError type>:
...`, with exit code 2."""
from __future__ import annotations

import argparse
import logging
import sys
import warnings

import torch

from delegate.errors import DelegateError, InputError
from delegate.timing import timed

VERBS = {
    "inspect": "print a .pte's methods, their inputs, the delegates with their ops and the "
               "device each would run on, and the ATen kernels left outside the delegates",
    "run": "run a method on random inputs (or --inputs), print each output's shape and the "
           "time per run, and time the ATen kernels left outside the delegates",
    "profile": "time every dispatch or node inside the delegates and every ATen kernel "
               "outside them, grouped by kernel, with each one's share of the method",
    "ops": "print the op table from the registry: each op, its dtypes, whether it has a CPU "
           "and a WebGPU kernel, and the edge targets it claims",
    "demo": "export a small transformer, lower it with our partitioner, save and run the "
            ".pte, and compare it with eager PyTorch",
}
DEVICE_HELP = ("where the delegates run: auto (a hardware WebGPU adapter, else the CPU "
               "kernels), webgpu (any adapter, software ones too) or cpu; default auto")


class UsageError(DelegateError):
    """A command-line argument is not one the verb accepts."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one typed line, not argparse's usage block
        raise UsageError(f"{message} (see {self.prog} --help)")


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)
        _quiet_third_party()
        return args.fn(args) or 0
    except DelegateError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m delegate", description=__doc__)
    sub = p.add_subparsers(title="verbs", dest="verb", required=True, metavar="VERB",
                           parser_class=_Parser,
                           help="`python -m delegate VERB --help` for its flags")
    for verb, fn in (("inspect", cmd_inspect), ("run", cmd_run), ("profile", cmd_profile)):
        s = sub.add_parser(verb, help=VERBS[verb], description=VERBS[verb])
        s.set_defaults(fn=fn)
        s.add_argument("pte", help="path of the .pte file")
        s.add_argument("--device", default="auto", choices=("auto", "webgpu", "cpu"),
                       help=DEVICE_HELP)
        s.add_argument("--method", default=None,
                       help="method to use (default: forward, else the first by name)"
                       + ("; inspect lists every method without it" if verb == "inspect" else ""))
        if verb != "inspect":
            s.add_argument("--inputs", metavar="FILE",
                           help="a torch.save'd list of input tensors (default: random inputs "
                                "at each input's upper-bound shape)")
            _add_runs(s, default=10)
    s = sub.add_parser("ops", help=VERBS["ops"], description=VERBS["ops"])
    s.add_argument("--markdown", action="store_true",
                   help="print a Markdown table (the README's op table)")
    s.set_defaults(fn=cmd_ops)
    d = sub.add_parser("demo", help=VERBS["demo"], description=VERBS["demo"])
    d.add_argument("--out", default="tiny_transformer.pte", metavar="FILE",
                   help="where to write the .pte (default: tiny_transformer.pte)")
    d.add_argument("--device", default="auto", choices=("auto", "webgpu", "cpu"),
                   help=DEVICE_HELP)
    _add_runs(d, default=10)
    d.set_defaults(fn=cmd_demo)
    return p


def _add_runs(parser, default: int) -> None:
    parser.add_argument("--runs", type=_positive_int, default=default, metavar="N",
                        help=f"timed runs after one warm-up; the minimum is reported "
                             f"(default {default})")


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return n


def _quiet_third_party() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # torchao (imported by executorch) warns about its own enum registration at import time.
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    logging.getLogger("torchao").setLevel(logging.ERROR)
    # torch.export's pytree deprecation notice, raised inside ExecuTorch's lowering.
    warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")


def cmd_inspect(args) -> int:
    from delegate.runtime.inspect import describe_program

    print(describe_program(_read(args.pte), device=args.device, method=args.method))
    return 0


def cmd_run(args) -> int:
    from delegate.runtime.inspect import pick_method, random_inputs
    from delegate.runtime.profile import outside_delegates
    from delegate.runtime.program import Runtime

    data = _read(args.pte)
    inputs = load_inputs(args.inputs) if args.inputs else None
    prog = Runtime.get().load_program(data, device=args.device)
    try:
        name = pick_method(prog.method_names, args.method)
        method = prog.load_method(name)
        inputs = inputs if inputs is not None else random_inputs(data, name)
        outs, ms = timed(lambda: method.execute(inputs), args.runs)
        for i, o in enumerate(outs):
            desc = f"{tuple(o.shape)} {o.dtype}" if isinstance(o, torch.Tensor) else repr(o)
            print(f"output {i}: {desc}")
        print(f"{name}: {ms:.3f} ms/run (min of {args.runs})")
        print("\n".join(outside_delegates(method, inputs, runs=min(args.runs, 3))))
    finally:
        prog.destroy()
    return 0


def cmd_profile(args) -> int:
    from delegate.runtime.profile import profile_method

    inputs = load_inputs(args.inputs) if args.inputs else None
    print(profile_method(_read(args.pte), method=args.method, device=args.device,
                         inputs=inputs, runs=args.runs))
    return 0


def cmd_ops(args) -> int:
    from delegate.op_table import op_table

    print(op_table(markdown=args.markdown))
    return 0


def cmd_demo(args) -> int:
    from delegate.demo import run_demo

    run_demo(args.out, device=args.device, runs=args.runs)
    return 0


def load_inputs(path: str) -> list:
    """A torch.save'd list (or tuple) of method inputs: tensors, or the Python scalars a
    method with scalar inputs takes."""
    what = f"--inputs {path}"
    try:
        obj = torch.load(path, weights_only=True)
    except OSError as e:
        raise InputError(f"{what}: expected a readable file, got {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001 - a file torch.save did not write fails in many ways
        first = (str(e).splitlines() or [""])[0]
        raise InputError(f"{what}: expected a file written by torch.save, got one torch.load "
                         f"cannot read ({type(e).__name__}: {first})") from None
    if not isinstance(obj, (list, tuple)):
        raise InputError(f"{what}: expected a list of tensors, got {type(obj).__name__}")
    for i, x in enumerate(obj):
        if not isinstance(x, (torch.Tensor, bool, int, float)):
            raise InputError(f"{what} item {i}: expected a tensor, got {type(x).__name__}")
    return list(obj)


def _read(path: str) -> bytes:
    from delegate.runtime.program import read_source

    return read_source(path)

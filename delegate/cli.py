"""python -m delegate: look into, run and profile a .pte on etwgpu's runner, list the ops the
delegate implements, run the demo, or export an LLM and generate with it. Every error is one
line, `error: <DelegateError type>: ...`, with exit code 2."""
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
    "export-llm": "build one of ExecuTorch's own LLM definitions (fixed-seed random weights or "
                  "a local Hugging Face checkpoint), quantise it, export it with a dynamic "
                  "prompt length and a KV cache, lower it with our partitioner and write the .pte",
    "generate": "greedy generation with an LLM .pte from export-llm: one prefill of the prompt, "
                "then one token per step; prints the token ids (and text, with --tokenizer) "
                "and a line of prompt tok/s, decode tok/s and time to first token",
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
    _add_export_llm(sub)
    _add_generate(sub)
    return p


def _add_export_llm(sub) -> None:
    from delegate.llm import MODELS, QUANTIZE

    e = sub.add_parser("export-llm", help=VERBS["export-llm"], description=VERBS["export-llm"])
    e.add_argument("--model", required=True, choices=sorted(MODELS), metavar="NAME",
                   help=f"which model: {', '.join(sorted(MODELS))}")
    e.add_argument("--quantize", required=True, choices=list(QUANTIZE), metavar="SCHEME",
                   help="weights of every linear: none (float32), int4-g32 or int4-g64 "
                        "(torchao int4 weight-only, symmetric, groups of 32 or 64: linear_q4gsw)")
    e.add_argument("--max-seq-len", required=True, type=_int_at_least(2), metavar="N",
                   help="the longest prompt and the positions the KV cache holds (>= 2)")
    e.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=True,
                   help="run the graph passes (fused QKV, SwiGLU, ...) at lowering; --no-fuse "
                        "lowers without them (default --fuse)")
    e.add_argument("--device", default="webgpu", choices=("webgpu", "cpu"),
                   help="the op set to partition for, webgpu or cpu; the .pte runs on either "
                        "(default webgpu)")
    e.add_argument("--checkpoint", metavar="DIR",
                   help="a local Hugging Face checkpoint directory (model.safetensors or "
                        "pytorch_model.bin) to load instead of random weights; nothing is "
                        "downloaded")
    e.add_argument("-o", "--out", required=True, metavar="FILE", help="where to write the .pte")
    e.set_defaults(fn=cmd_export_llm)


def _add_generate(sub) -> None:
    g = sub.add_parser("generate", help=VERBS["generate"], description=VERBS["generate"])
    g.add_argument("pte", help="path of a .pte written by export-llm")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-len", type=_positive_int, metavar="N",
                     help="a prompt of N fixed-seed random token ids")
    src.add_argument("--tokens", type=_token_ids, metavar="IDS",
                     help="the prompt as comma-separated token ids, e.g. 1,2,3")
    src.add_argument("--prompt", metavar="TEXT", help="the prompt as text (needs --tokenizer)")
    g.add_argument("--new-tokens", required=True, type=_positive_int, metavar="M",
                   help="how many tokens to generate (the first comes from the prefill)")
    g.add_argument("--device", default="auto", choices=("auto", "webgpu", "cpu"),
                   help=DEVICE_HELP)
    g.add_argument("--tokenizer", metavar="FILE",
                   help="a local tokenizer file that the executorch wheel's pytorch_tokenizers "
                        "reads (tokenizer.json, a SentencePiece or a tiktoken model): encodes "
                        "--prompt and prints the generated text")
    g.set_defaults(fn=cmd_generate)


def _add_runs(parser, default: int) -> None:
    parser.add_argument("--runs", type=_positive_int, default=default, metavar="N",
                        help=f"timed runs after one warm-up; the minimum is reported "
                             f"(default {default})")


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = low - 1
        if n < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return n
    return parse


_positive_int = _int_at_least(1)


def _token_ids(text: str) -> list:
    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        ids = []
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids >= 0, got {text!r}")
    return ids


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


def cmd_export_llm(args) -> int:
    from delegate.llm import export_llm
    from delegate.runtime.inspect import describe_outside

    # ExecuTorch's Llama code and emitter, on every export: deprecation and mutable-cache notes.
    warnings.filterwarnings("ignore", message="_check_is_size", category=FutureWarning)
    warnings.filterwarnings("ignore", message="Mutation on a buffer", category=UserWarning)
    data = export_llm(args.model, args.quantize, args.max_seq_len, device=args.device,
                      fuse=args.fuse, checkpoint=args.checkpoint,
                      progress=sys.stderr.isatty())
    try:
        with open(args.out, "wb") as f:
            f.write(data)
    except OSError as e:
        raise InputError(f"-o {args.out}: expected a writable path, "
                         f"got {e.strerror or e}") from None
    print(f"wrote {args.out}: {len(data) / 2**20:.1f} MiB ({args.model}, {args.quantize}, "
          f"max seq len {args.max_seq_len})")
    print(describe_outside(data, "forward"))
    return 0


def cmd_generate(args) -> int:
    from delegate.llm import check_request, generate, load_tokenizer, read_meta
    from delegate.runtime.program import Runtime

    if args.prompt is not None and args.tokenizer is None:
        raise UsageError("--prompt: expected --tokenizer FILE to encode it, got none")
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    prog = Runtime.get().load_program(_read(args.pte), device=args.device)
    try:
        meta = read_meta(prog)
        if args.tokens is not None:
            prompt = args.tokens
        elif args.prompt is not None:
            prompt = tokenizer.encode(args.prompt, bos=True, eos=False)
        else:
            g = torch.Generator().manual_seed(0)
            prompt = torch.randint(0, meta.vocab_size, (args.prompt_len,), generator=g).tolist()
        check_request(meta, prompt, args.new_tokens)
        out, timings = generate(prog.load_method("forward"), prompt, args.new_tokens,
                                progress=sys.stderr.isatty())
    finally:
        prog.destroy()
    print(f"prompt: {len(prompt)} token(s): {', '.join(map(str, prompt))}")
    print(f"generated: {len(out)} token(s): {', '.join(map(str, out))}")
    if tokenizer is not None:
        print(f"text: {tokenizer.decode(out)!r}")
    print(timings.line())
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

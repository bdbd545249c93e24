"""Llama-3.2-1B (ExecuTorch's own definition, int4-g32; any model of delegate/llm.py) prefill
and decode on our WebGPU executor, against the same model in eager bf16 PyTorch on CUDA in the
same run.

    python bench/llama.py [--model llama3_2_1b] [--prefill 128,512,2048] [--contexts 128,2048]
                          [--steps 32] [--quantize int4-g32|none] [--profile]

Weights are fixed-seed random (nothing is downloaded). The KV caches live in the delegate; a
decode step uploads the token and a params prefix and reads back the last token's logits.
Figures are the best of several runs after a 1.5 s GPU warm-up (an idle H200 clocks at 345 of
1980 MHz). --profile adds the per-kernel GPU time of one decode step and one prefill.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from delegate import llm
from delegate.runtime.program import Runtime



def build(name: str, max_seq: int, quantize: str, dtype=torch.float32):
    model = llm.quantize(llm.build_model(name, max_seq), quantize)
    return model.to(dtype)


def _old_torch_slice_guard() -> None:
    """The H200 image's torch 2.11 cannot decide `pos + T <= rows` when ExecuTorch re-traces
    the delegate for `narrow(freqs, 0, pos, T)` in to_executorch; the torch 2.13 that
    ExecuTorch 1.5 pins can. For that meta trace only, on older torch: a slice whose end
    cannot be compared is taken as in range (the delegate checks it at every execute)."""
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 13):
        return
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    op = torch.ops.aten.slice.Tensor
    original = op.py_kernels[torch._C.DispatchKey.Meta]

    def slice_meta(self, dim=0, start=None, end=None, step=1):
        try:
            return original(self, dim, start, end, step)
        except GuardOnDataDependentSymNode:
            sizes, strides = list(self.size()), list(self.stride())
            d = dim % self.dim()
            offset = self.storage_offset() + start * strides[d]
            sizes[d] = (end - start + step - 1) // step
            strides[d] *= step
            return self.as_strided(sizes, strides, offset)

    op.py_kernels[torch._C.DispatchKey.Meta] = slice_meta
    op._dispatch_cache.clear()


def export(name: str, max_seq: int, quantize: str) -> bytes:
    _old_torch_slice_guard()
    return llm.export_llm(name, quantize, max_seq, device="webgpu")


VOCAB = [0]


def tokens(n: int) -> torch.Tensor:
    return torch.randint(0, VOCAB[0], (1, n))


def best_of(fn, runs: int) -> float:
    fn()
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def warm(m, max_seq: int, seconds: float = 1.5) -> None:
    end, x = time.perf_counter() + seconds, tokens(min(128, max_seq))
    while time.perf_counter() < end:
        m.execute([x, torch.tensor([0])])


def ours(m, prefills, contexts, steps: int) -> dict:
    out = {}
    for t in prefills:
        x = tokens(t)
        out["prefill", t] = t / best_of(lambda: m.execute([x, torch.tensor([0])]), 3)
    for c in contexts:
        m.execute([tokens(c), torch.tensor([0])])
        tok = tokens(1)
        per = []
        for rep in range(3):
            t0 = time.perf_counter()
            for i in range(steps):
                m.execute([tok, torch.tensor([c + i])])
            per.append((time.perf_counter() - t0) / steps)
        out["decode", c] = 1 / min(per)
    return out


def submits(m, context: int, steps: int) -> None:
    """Decode tok/s with the dispatch list cut into submits of SUBMIT_EVERY dispatches."""
    from delegate.runtime import webgpu_executor as wx

    keep, tok = wx.SUBMIT_EVERY, tokens(1)
    for every in (32, 64, 128, 256, 100000):
        wx.SUBMIT_EVERY = every
        m.execute([tokens(context), torch.tensor([0])])
        per = min(best_of(lambda: [m.execute([tok, torch.tensor([context + i])])
                                   for i in range(steps)], 2) / steps for _ in range(2))
        print(f"  decode {context}, submits of {every:6d} dispatches: {1 / per:7.1f} tok/s")
    wx.SUBMIT_EVERY = keep


def cuda_peer(name: str, max_seq: int, prefills, contexts, steps: int) -> dict:
    """The same ExecuTorch model in eager bf16 on CUDA, KV cache and all."""
    if not torch.cuda.is_available():
        return {}
    model = build(name, max_seq, "none", torch.bfloat16).cuda()
    dev = torch.device("cuda")

    def run(x, pos):
        model(x.to(dev), {"input_pos": torch.tensor([pos], device=dev)})
        torch.cuda.synchronize()

    out = {}
    with torch.no_grad():
        for t in prefills:
            x = tokens(t)
            out["prefill", t] = t / best_of(lambda: run(x, 0), 3)
        for c in contexts:
            run(tokens(c), 0)
            tok = tokens(1).to(dev)
            per = []
            for rep in range(3):
                t0 = time.perf_counter()
                for i in range(steps):
                    model(tok, {"input_pos": torch.tensor([c + i], device=dev)})
                torch.cuda.synchronize()
                per.append((time.perf_counter() - t0) / steps)
            out["decode", c] = 1 / min(per)
    del model
    torch.cuda.empty_cache()
    return out


def profile(m, x, pos: int) -> None:
    (_, executor), = m.delegates
    outs, times, clock = executor.execute_profiled([x, torch.tensor([pos])])
    by = defaultdict(lambda: [0, 0.0])
    for label, sec in times:
        kernel = label.split(" [")[0]
        by[kernel][0] += 1
        by[kernel][1] += sec
    total = sum(s for _, s in by.values())
    print(f"  profile T={x.shape[1]} pos={pos} ({clock}): {len(times)} dispatches, "
          f"{total * 1e3:.3f} ms")
    for kernel, (n, sec) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"    {kernel:32s} {n:5d} {sec * 1e3:9.3f} ms {100 * sec / total:5.1f}%")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama3_2_1b", choices=sorted(llm.MODELS))
    p.add_argument("--max-seq", type=int, default=2048)
    p.add_argument("--prefill", default="128,512,2048")
    p.add_argument("--contexts", default="128,2048")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--quantize", default="int4-g32")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--save", help="write the .pte here (a later run can --load it)")
    p.add_argument("--load", help="skip the export: run this .pte")
    a = p.parse_args()
    prefills = [int(t) for t in a.prefill.split(",") if t]
    contexts = [int(c) for c in a.contexts.split(",") if c]
    # a context at the cache's end decodes its steps just below it (ExecuTorch checks pos < max)
    contexts = [min(c, a.max_seq - a.steps - 1) for c in contexts]
    t0 = time.perf_counter()
    VOCAB[0] = llm.MODELS[a.model].args["vocab_size"]
    if a.load:
        with open(a.load, "rb") as f:
            pte = f.read()
    else:
        pte = export(a.model, a.max_seq, a.quantize)
        print(f"export + quantize + lower: {time.perf_counter() - t0:.1f} s, "
              f".pte {len(pte) / 2**20:.0f} MiB")
    if a.save:
        with open(a.save, "wb") as f:
            f.write(pte)
    t0 = time.perf_counter()
    prog = Runtime.get().load_program(pte, device="webgpu")
    m = prog.load_method("forward")
    print(f"load: {time.perf_counter() - t0:.1f} s")
    warm(m, a.max_seq)
    got = ours(m, prefills, contexts, a.steps)
    submits(m, contexts[0], a.steps)
    if a.profile:
        profile(m, tokens(1), min(128, a.max_seq // 2))
        profile(m, tokens(min(512, a.max_seq)), 0)
    prog.destroy()
    peer = {} if a.skip_peer else cuda_peer(a.model, a.max_seq, prefills, contexts, a.steps)
    print(f"\n{a.model} {a.quantize}, max seq {a.max_seq}")
    print(f"{'case':18s} {'ours tok/s':>12s} {'torch cuda bf16':>16s} {'ours/peer':>10s}")
    for key, v in got.items():
        ref = peer.get(key)
        ratio = f"{v / ref:10.3f}" if ref else f"{'-':>10s}"
        print(f"{key[0] + ' ' + str(key[1]):18s} {v:12.1f} {ref or float('nan'):16.1f} {ratio}")


if __name__ == "__main__":
    main()

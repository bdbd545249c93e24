"""Llama-3.2-1B (ExecuTorch's own definition, int4-g32) prefill and decode on our WebGPU
executor, against the same model in eager bf16 PyTorch on CUDA in the same run.

    python bench/llama.py [--layers 16] [--prefill 128,512,2048] [--contexts 128,2048]
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

from delegate.aot import lower, undelegated_ops
from delegate.runtime.program import Runtime

# Llama-3.2-1B's published shape (meta-llama/Llama-3.2-1B config.json: hidden 2048, 16 layers,
# 32 heads, 8 KV heads, FFN 8192, vocab 128256, rope theta 500000 with Llama-3 scaling 32)
LLAMA3_2_1B = dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256,
                   hidden_dim=8192, norm_eps=1e-5, rope_theta=500000.0, use_scaled_rope=True,
                   rope_scale_factor=32, use_kv_cache=True, enable_dynamic_shape=True,
                   generate_full_logits=False)


def build(layers: int, max_seq: int, quantize: str, dtype=torch.float32, vocab: int = 128256):
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(0)
    args = ModelArgs(**{**LLAMA3_2_1B, "n_layers": layers, "max_seq_len": max_seq,
                        "max_context_len": max_seq, "vocab_size": vocab})
    model = construct_transformer(args).to(dtype).eval().requires_grad_(False)
    if quantize != "none":
        from torchao.quantization import IntxWeightOnlyConfig, quantize_
        from torchao.quantization.granularity import PerGroup

        group = int(quantize.split("-g")[1])
        quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group)))
    return model


def export(model, max_seq: int) -> bytes:
    seq = torch.export.Dim("T", min=1, max=max_seq)
    example = (torch.zeros(1, 8, dtype=torch.long), {"input_pos": torch.tensor([0])})
    pm = lower(model, example, dynamic_shapes=({1: seq}, {"input_pos": None}), device="webgpu")
    outside = undelegated_ops(pm)
    print(f"lowered: {len(outside)} ops outside the delegate {sorted(set(outside))}")
    return pm.buffer


VOCAB = [LLAMA3_2_1B["vocab_size"]]


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


def cuda_peer(layers: int, max_seq: int, prefills, contexts, steps: int, vocab: int) -> dict:
    """The same ExecuTorch model in eager bf16 on CUDA, KV cache and all."""
    if not torch.cuda.is_available():
        return {}
    model = build(layers, max_seq, "none", torch.bfloat16, vocab).cuda()
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
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--max-seq", type=int, default=2048)
    p.add_argument("--prefill", default="128,512,2048")
    p.add_argument("--contexts", default="128,2048")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--quantize", default="int4-g32")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--save", help="write the .pte here (a later run can --load it)")
    p.add_argument("--load", help="skip the export: run this .pte")
    p.add_argument("--vocab", type=int, default=LLAMA3_2_1B["vocab_size"],
                   help="a smaller vocabulary for a smoke run on a software adapter")
    a = p.parse_args()
    prefills = [int(t) for t in a.prefill.split(",") if t]
    contexts = [int(c) for c in a.contexts.split(",") if c]
    contexts = [c for c in contexts if c + a.steps <= a.max_seq]
    t0 = time.perf_counter()
    VOCAB[0] = a.vocab
    pte = export(build(a.layers, a.max_seq, a.quantize, vocab=a.vocab), a.max_seq)
    print(f"export + quantize + lower: {time.perf_counter() - t0:.1f} s, .pte {len(pte) / 2**20:.0f} MiB")
    prog = Runtime.get().load_program(pte, device="webgpu")
    m = prog.load_method("forward")
    print(f"load: {time.perf_counter() - t0:.1f} s")
    warm(m, a.max_seq)
    got = ours(m, prefills, contexts, a.steps)
    if a.profile:
        profile(m, tokens(1), min(128, a.max_seq // 2))
        profile(m, tokens(min(512, a.max_seq)), 0)
    prog.destroy()
    peer = {} if a.skip_peer else cuda_peer(a.layers, a.max_seq, prefills, contexts, a.steps,
                                                 a.vocab)
    print(f"\nllama3_2_1b {a.quantize}, {a.layers} layers, max seq {a.max_seq}")
    print(f"{'case':18s} {'ours tok/s':>12s} {'torch cuda bf16':>16s} {'ours/peer':>10s}")
    for key, v in got.items():
        ref = peer.get(key)
        ratio = f"{v / ref:10.3f}" if ref else f"{'-':>10s}"
        print(f"{key[0] + ' ' + str(key[1]):18s} {v:12.1f} {ref or float('nan'):16.1f} {ratio}")


if __name__ == "__main__":
    main()

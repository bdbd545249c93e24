"""WGSL kernels against peers measured in the same run (SDPA part).

    prefill   causal SDPA, B=1, T=512, 32 query heads (32 and 8 kv heads), d=64:
              effective TFLOP/s = 4*T*T*d*heads/2 / time (causal: half the score matrix)
    decode    Lq=1 over 2048 cached keys, 32 query / 8 kv heads, d=64: µs, and K+V bytes / time;
              the flash-decoding split (two passes, scratch) and the one-pass kernel
    peer      torch's SDPA on CUDA in fp32 and bf16 when torch.cuda is available, else n/a;
              ratio = peer time / our time (above 1: we are faster)

Our times are GPU timestamps around a pass of back-to-back dispatches when the adapter offers
them (else wall time); the wall column is one submit of those dispatches (delegate.timing.timed).
The table goes to stdout and bench/results/kernels_<adapter>.txt.

    python bench/kernels.py
    ETWGPU_ADAPTER=nvidia python bench/kernels.py
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from anywhere

from bench.q4gsw import Gpu  # noqa: E402
from delegate.timing import timed  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class SdpaCase:
    name: str
    hq: int
    hkv: int
    l: int
    s: int
    d: int
    causal: bool
    split: bool = True    # bind scratch: flash-decoding splits where the builder routes them
    kv_len: int | None = None   # a KV cache filled to kv_len of its s rows (decode at kv_len - 1)

    @property
    def keys(self) -> int:
        return self.s if self.kv_len is None else self.kv_len

    def flops(self) -> float:
        pairs = self.l * self.keys / 2 if self.causal else self.l * self.keys
        return 4.0 * self.hq * pairs * self.d

    def kv_bytes(self) -> int:
        return 2 * self.hkv * self.keys * self.d * 4


CASES = [
    SdpaCase("prefill causal T=512 32/32 heads d=64", 32, 32, 512, 512, 64, True),
    SdpaCase("prefill causal T=512 32/8 heads d=64", 32, 8, 512, 512, 64, True),
    SdpaCase("decode S=2048 32/8 heads d=64 split", 32, 8, 1, 2048, 64, False),
    SdpaCase("decode S=2048 32/8 heads d=64 one pass", 32, 8, 1, 2048, 64, False, split=False),
    SdpaCase("decode cache 129 of 2048 32/8 d=64", 32, 8, 1, 2048, 64, False, kv_len=129),
    SdpaCase("decode cache 2048 of 2048 32/8 d=64", 32, 8, 1, 2048, 64, False, kv_len=2048),
]


def sdpa_inputs(c: SdpaCase, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, c.hq, c.l, c.d, generator=g), torch.randn(1, c.hkv, c.s, c.d, generator=g),
            torch.randn(1, c.hkv, c.s, c.d, generator=g))


def time_ours(gpu: Gpu, c: SdpaCase, reps: int, check: bool = True) -> tuple:
    """(seconds per call by timestamps or None, wall seconds, dispatch labels); `check=False`
    skips the comparison with torch (for probes that time a modified kernel)."""
    import kernels_wgsl

    q, k, v = sdpa_inputs(c)
    attrs = {"is_causal": c.causal, "scale": None, "enable_gqa": c.hkv != c.hq}
    if c.kv_len is not None:   # a cache: the query row sits at kv_len - 1, every key visible
        attrs.update(is_causal=True, kv_len=c.kv_len, causal_offset=c.kv_len - c.l)
    ins, outs = [tuple(q.shape), tuple(k.shape), tuple(v.shape), None], [tuple(q.shape)]
    info = kernels_wgsl.BuildInfo(gpu.dev, (torch.float32,) * 3 + (None,), scratch=c.split)
    specs = kernels_wgsl.get_kernel("sdpa").build(ins, outs, attrs, info)
    scratch = max((n for s in specs for n in s.scratch), default=16)
    out = gpu.buffer(q.numel() * 4)
    buffers = [gpu.buffer(0, t.numpy().tobytes()) for t in (q, k, v)] + [None, out,
                                                                          gpu.buffer(scratch)]
    steps = []
    for spec in specs:
        params, count = spec.sizes(ins, outs, attrs)
        if count:
            steps.append((*gpu.bound(spec, buffers, params), gpu.fold(count), spec.label))

    def encode(enc, cp, r):
        for pipeline, group, grid, _ in steps:
            cp.set_pipeline(pipeline)
            cp.set_bind_group(0, group)
            cp.dispatch_workgroups(*grid)

    t_ts, _ = gpu.time(encode, reps)
    # wall: one submit of `reps` dispatches, waited for, best of 3
    _, wall_ms = timed(lambda: gpu._submit(encode, reps, None, False), 3)
    t_wall = wall_ms * 1e-3 / reps
    got = torch.frombuffer(bytearray(gpu.device.queue.read_buffer(out)), dtype=torch.float32)
    n = c.keys
    want = F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n], is_causal=c.causal,
                                          enable_gqa=c.hkv != c.hq)
    err = (got.view_as(want) - want).abs().max().item()
    if check and not err <= 1e-3:
        raise SystemExit(f"{c.name}: expected torch's SDPA within 1e-3, got max error {err}")
    for b in buffers:
        if b is not None:
            b.destroy()
    return t_ts, t_wall, " + ".join(label for *_, label in steps)


def time_torch_cuda(c: SdpaCase, dtype, reps: int) -> float | None:
    """Seconds per call of torch's SDPA on CUDA (CUDA events, best of 3), None without CUDA."""
    if not torch.cuda.is_available():
        return None
    q, k, v = (t.to("cuda", dtype) for t in sdpa_inputs(c))
    k, v = k[:, :, :c.keys], v[:, :, :c.keys]

    def run():
        return F.scaled_dot_product_attention(q, k, v, is_causal=c.causal, enable_gqa=c.hkv != c.hq)

    best = float("inf")
    for _ in range(4):   # the first is warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            run()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3 / reps)
    return best


def fmt_peer(ours: float, peer: float | None, c: SdpaCase) -> str:
    if peer is None:
        return "n/a"
    return f"{peer * 1e6:9.1f} µs {c.flops() / peer * 1e-12:6.3g} TF/s  x{peer / ours:5.2f}"


def sdpa_table(gpu: Gpu, reps: int) -> list:
    lines = [f"SDPA on {gpu.dev.name} ({'timestamps' if gpu.dev.has_timestamps else 'wall'})",
             f"{'case':42s} {'ours µs':>9s} {'TF/s':>6s} {'KV GB/s':>8s}  {'wall µs':>9s}  "
             f"{'torch cuda fp32 (µs, TF/s, ratio)':34s}  {'torch cuda bf16':34s}  kernels"]
    for c in CASES:
        t_ts, t_wall, labels = time_ours(gpu, c, reps)
        ours = t_ts if t_ts is not None else t_wall
        fp32, bf16 = (time_torch_cuda(c, dt, reps) for dt in (torch.float32, torch.bfloat16))
        lines.append(f"{c.name:42s} {ours * 1e6:9.1f} {c.flops() / ours * 1e-12:6.3g} "
                     f"{c.kv_bytes() / ours * 1e-9:8.1f}  {t_wall * 1e6:9.1f}  "
                     f"{fmt_peer(ours, fp32, c):34s}  {fmt_peer(ours, bf16, c):34s}  {labels}")
        print(lines[-1], flush=True)
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=0, help="dispatches per timing (default: 20 on a "
                    "GPU, 1 on a CPU adapter)")
    args = ap.parse_args(argv)
    gpu = Gpu()
    cpu_adapter = "cpu" in str(gpu.dev.adapter.info.get("adapter_type", "")).lower()
    reps = args.reps or (1 if cpu_adapter else 20)
    if cpu_adapter:
        gpu.warm_s, gpu.trials = 0.0, 1
    print(f"{gpu.dev.name}: {reps} reps per timing", flush=True)
    try:
        lines = sdpa_table(gpu, reps)
    finally:
        gpu.release()
    RESULTS.mkdir(exist_ok=True)
    adapter = re.sub(r"[^A-Za-z0-9]+", "_", gpu.dev.name.split("[")[0]).strip("_").lower()
    path = RESULTS / f"kernels_{adapter}.txt"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""WGSL kernels against peers measured in the same run: issue #11's figures in one table.

    sdpa    causal SDPA prefill, B=1, T=512, 32 query heads (32 and 8 kv heads), d=64:
            effective TFLOP/s = 4*T*T*d*heads/2 / time (causal: half the score matrix);
            decode Lq=1 over 2048 cached keys, 32 query / 8 kv heads, d=64: µs and K+V bytes /
            time, the flash-decoding split (two passes, scratch) and the one-pass kernel;
            peers: torch's SDPA on CUDA in fp32 and bf16
    gemm    the routed q4gsw GEMM at M=512, K=2048, N=8192 (int4, group 32): TFLOP/s against
            torch's dense fp32 and fp16 matmul on CUDA
    gemv    the routed q4gsw GEMV of Llama-3.2-1B's LM head (K=2048, N=128256): packed weight
            bytes / time against torch's device-to-device copy (bytes read + written / time)
            and WebGPU's copy_buffer_to_buffer
    layer   the Llama-3.2-1B-shaped int4 decoder layer of bench/overhead.py (hidden 2048, GQA
            32/8 x 64, SwiGLU 8192) at T=1 and T=512: dispatches and the sum of their GPU
            timestamps (a compute pass each, as the issue measured), and the GPU time of all of
            them in one pass (as execute encodes them: a pass per dispatch adds each its own
            start-up and drain), against the same block in dense bf16 eager torch on CUDA

Every figure is printed with its ratio to its peer (above 1: ours is faster, or for the GEMV
the fraction of the copy's bandwidth) and the issue's target. Our kernel times are GPU
timestamps around back-to-back dispatches when the adapter offers them (else wall time).
The table goes to stdout and bench/results/kernels_<adapter>.txt, the rows to a .json beside
it, and with --plot a bar chart of the ratios to kernels_<adapter>.png (matplotlib: the
`bench` extra). --plot-only FILE.json draws the chart of an earlier run (from the H200, say).
Peers that need CUDA print n/a without it. --small shrinks the layer (256 wide) for lavapipe.

    python bench/kernels.py [--only sdpa,gemm,gemv,layer] [--plot]
    ETWGPU_ADAPTER=nvidia python bench/kernels.py --plot
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from anywhere

from bench.q4gsw import (Gpu, copy_peers, q4_specs, time_q4,  # noqa: E402
                         torch_matmul_tflops)
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
    SdpaCase("prefill causal T=512 32/32 heads d=64 one pass", 32, 32, 512, 512, 64, True,
             split=False),
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


@dataclass
class Figure:
    """One row: our value, its peers' in the same unit, the ratio to each, and the target."""
    section: str
    case: str
    ours: float
    unit: str                 # "µs", "TF/s", "GB/s"
    peers: dict               # peer name -> value in `unit` (None: not measured here)
    target: str = ""
    detail: str = ""          # kernels, dispatches

    def ratio(self, peer: str):
        """ours / peer for rates, peer / ours for times: above 1, ours is faster."""
        value = self.peers.get(peer)
        if not value:
            return None
        return value / self.ours if self.unit == "µs" else self.ours / value

    def line(self) -> str:
        peers = "  ".join(f"{name} {'n/a' if v is None else f'{v:.4g}'}"
                          f"{'' if self.ratio(name) is None else f' (x{self.ratio(name):.2f})'}"
                          for name, v in self.peers.items())
        return (f"{self.section:6s} {self.case:44s} {self.ours:10.4g} {self.unit:5s} {peers:64s}"
                f" {self.target:14s} {self.detail}")


def sdpa_figures(gpu: Gpu, reps: int) -> list:
    out = []
    for c in CASES:
        t_ts, t_wall, labels = time_ours(gpu, c, reps)
        ours = t_ts if t_ts is not None else t_wall
        fp32, bf16 = (time_torch_cuda(c, dt, reps) for dt in (torch.float32, torch.bfloat16))
        if c.l > 1:
            peers = {"torch fp32": fp32 and c.flops() / fp32 * 1e-12,
                     "torch bf16": bf16 and c.flops() / bf16 * 1e-12}
            fig = Figure("sdpa", c.name, c.flops() / ours * 1e-12, "TF/s", peers,
                         ">= 10 TF/s" if c.hkv == c.hq else "", labels)
        else:
            peers = {"torch fp32": fp32 and fp32 * 1e6, "torch bf16": bf16 and bf16 * 1e6}
            fig = Figure("sdpa", c.name, ours * 1e6, "µs", peers,
                         "<= 15 µs" if c.split and c.kv_len is None else "",
                         f"{labels}; {c.kv_bytes() / ours * 1e-9:.0f} GB/s of K+V")
        out.append(fig)
        print(fig.line(), flush=True)
    return out


def routed_q4(gpu: Gpu, m: int, k: int, n: int):
    spec = next(s for s, routed in q4_specs(gpu, m, k, n) if routed)
    t_ts, t_wall = time_q4(gpu, spec, m, k, n, 20 if m > 1 else 50, check=m * n * k <= 2 ** 33)
    return (t_ts if t_ts is not None else t_wall), spec.label


def gemm_figures(gpu: Gpu, reps: int) -> list:
    m, k, n = 512, 2048, 8192
    t, label = routed_q4(gpu, m, k, n)
    flops = 2 * m * n * k
    peers = {"torch fp32": torch_matmul_tflops(m, k, n, 20, torch.float32),
             "torch fp16": torch_matmul_tflops(m, k, n, 20, torch.float16)}
    fig = Figure("gemm", f"q4gsw M={m} K={k} N={n}", flops / t * 1e-12, "TF/s", peers,
                 ">= 30 TF/s", label)
    print(fig.line(), flush=True)
    return [fig]


def gemv_figures(gpu: Gpu, reps: int) -> list:
    k, n = 2048, 128256
    copy_bw, torch_bw = copy_peers(gpu, 20)
    t, label = routed_q4(gpu, 1, k, n)
    peers = {"torch copy": torch_bw and torch_bw * 1e-9, "wgpu copy": copy_bw * 1e-9}
    fig = Figure("gemv", f"LM head K={k} N={n}", n * k / 2 / t * 1e-9, "GB/s", peers,
                 ">= 0.60 of torch copy", f"{label}; {t * 1e6:.1f} µs")
    print(fig.line(), flush=True)
    return [fig]


def torch_layer_us(small: bool, t: int):
    """µs of the same TransformerBlock, dense bf16, in eager torch on CUDA (None without)."""
    if not torch.cuda.is_available():
        return None
    from delegate.models import TransformerBlock, seeded

    dim, heads, hidden, kv = (256, 4, 512, 2) if small else (2048, 32, 8192, 8)
    block = seeded(TransformerBlock(dim, heads, hidden, kv_heads=kv)).to("cuda", torch.bfloat16)
    x = torch.randn(1, t, dim, device="cuda", dtype=torch.bfloat16)
    best = float("inf")
    with torch.no_grad():
        for _ in range(4):   # the first is warm-up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                block(x)
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) * 1e3 / 10)
    return best


def layer_figures(gpu: Gpu, reps: int, small: bool) -> list:
    from bench.overhead import _gpu_us, llama_layer, load, warm_gpu

    dim = 256 if small else 2048
    prog, m = load(llama_layer(small), "webgpu")
    (_, executor), = m.delegates
    out = []
    try:
        warm_gpu(m, torch.randn(1, 512, dim), 0.0 if small else 1.5)
        for t, target in ((1, "<= 80 µs, <= 10 disp."), (512, "<= 2500 µs")):
            x = torch.randn(1, t, dim)
            n = len(executor.plan.binding_for([x]).payload.dispatches)
            peers = {"torch bf16": torch_layer_us(small, t)}
            name = f"{'small' if small else 'Llama-3.2-1B'} layer T={t}"
            for how, whole in (("GPU sum", False), ("one pass", True)):
                fig = Figure("layer", f"{name} {how}",
                             _gpu_us(executor, x, "whole" if whole else "each", 5), "µs",
                             peers, target, f"{n} dispatches" + (
                                 "; a pass each, as the issue measured" if not whole else
                                 "; one pass with stamps at its ends, as execute encodes"))
                out.append(fig)
                print(fig.line(), flush=True)
    finally:
        prog.destroy()
    return out


SECTIONS = ("sdpa", "gemm", "gemv", "layer")


def plot(figures: list, title: str, path: Path) -> bool:
    """A bar per (figure, peer) ratio, log scale, 1 marked; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no PNG: matplotlib is not installed (pip install -e '.[bench]')")
        return False
    bars = [(f"{f.section}: {f.case}\nvs {peer}", f.ratio(peer)) for f in figures
            for peer in f.peers if f.ratio(peer) is not None]
    if not bars:
        print("no PNG: no figure has a measured peer here")
        return False
    fig, ax = plt.subplots(figsize=(12, 0.42 * len(bars) + 1.5))
    labels, ratios = zip(*bars)
    ax.barh(range(len(bars)), ratios, color=["tab:green" if r >= 1 else "tab:red" for r in ratios])
    ax.set_yticks(range(len(bars)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("ours / peer (above 1: ours faster; GEMV: fraction of copy bandwidth)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return True


def load_figures(path: Path) -> tuple:
    data = json.loads(path.read_text())
    return data["adapter"], [Figure(**f) for f in data["figures"]]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=0, help="dispatches per timing (default: 20 on a "
                    "GPU, 1 on a CPU adapter)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"of {','.join(SECTIONS)}")
    ap.add_argument("--small", action="store_true", help="a 256-wide layer (lavapipe)")
    ap.add_argument("--plot", action="store_true", help="also write the PNG bar chart")
    ap.add_argument("--plot-only", type=Path, help="draw the chart of an earlier run's .json")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for .txt/.json/.png")
    args = ap.parse_args(argv)
    if args.plot_only:
        adapter, figures = load_figures(args.plot_only)
        plot(figures, adapter, args.plot_only.with_suffix(".png"))
        return
    gpu = Gpu()
    cpu_adapter = "cpu" in str(gpu.dev.adapter.info.get("adapter_type", "")).lower()
    reps = args.reps or (1 if cpu_adapter else 20)
    if cpu_adapter:
        gpu.warm_s, gpu.trials = 0.0, 1
    header = (f"{gpu.dev.name} ({'timestamps' if gpu.dev.has_timestamps else 'wall'}), {reps} "
              f"reps per timing; ratio in parentheses: above 1 ours is faster")
    print(header, flush=True)
    figures = []
    try:
        for name in args.only.split(","):
            figures += (layer_figures(gpu, reps, args.small) if name == "layer"
                        else globals()[f"{name}_figures"](gpu, reps))
    finally:
        gpu.release()
    args.out.mkdir(parents=True, exist_ok=True)
    adapter = re.sub(r"[^A-Za-z0-9]+", "_", gpu.dev.name.split("[")[0]).strip("_").lower()
    stem = args.out / f"kernels_{adapter}"
    stem.with_suffix(".txt").write_text("\n".join([header] + [f.line() for f in figures]) + "\n")
    stem.with_suffix(".json").write_text(json.dumps(
        {"adapter": gpu.dev.name, "figures": [asdict(f) for f in figures]}, indent=1))
    print(f"wrote {stem}.txt and .json")
    if args.plot:
        plot(figures, header, stem.with_suffix(".png"))


if __name__ == "__main__":
    main()

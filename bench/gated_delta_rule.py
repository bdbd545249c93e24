"""Gated delta rule: our CPU kernel vs ExecuTorch's C++ op vs a naive token loop, then our WGSL
kernel vs FLA on CUDA.

Same inputs for all, fp32, B=1, H=16, K=V=128, channelwise decay in (0, 1); CPU at T = 1, 128,
512, 2048, 8192 at 1 and 2 threads. Milliseconds are the min over several runs. "ours" calls
our kernel's Python entry; "runner" is the op exported, lowered with WgpuPartitioner(device=
"cpu") and executed through our .pte runner (Program.load_method().execute), the user's path
with its host cost; the ratios are to ExecuTorch's C++ op.

GPU table (T = 1, 512, 2048, 8192 by default): "webgpu" is the GPU time of our dispatches
(timestamp queries through WebGpuExecutor.execute_profiled, summed over the op's dispatches,
min over runs after a warm-up; "wall" when the adapter has no timestamps). "FLA" is
flash-linear-attention's chunk_gated_delta_rule (T > 1) / fused_recurrent_gated_delta_rule
(T = 1) on CUDA, timed with CUDA events; its gated delta rule takes one gate per head, so it
gets the per-token mean of our log decays (the same work per token; KDA is its channelwise
variant). "n/a" when fla or CUDA is missing.

Thread counts: our kernel runs on our pool (kernels_cpu.threadpool.set_num_threads) with torch
intra-op threads at 1 inside it. ExecuTorch's op parallelises over its own threadpool
(extension/threadpool, shared with the pybindings), whose size we read with
portable_lib._threadpool_get_thread_count() and set with portable_lib._unsafe_reset_threadpool(n).
The naive loop and the sgemm reference use torch.set_num_threads(n).

Per-kernel GPU ms follow each webgpu row, summed per label over a call's dispatches (chunk_prep,
chunk_scan and chunk_out run once per segment of chunks; "recurrent" is the decode kernel at
T = 1 and the carry copy otherwise). --scan-columns repeats the GPU table with chunk_scan's
value columns per workgroup forced to each value (the builder still stages as many chunk rows
as the device's workgroup memory holds).

    python bench/gated_delta_rule.py [--ts 1,128,512] [--threads 1,2] [--gpu-ts 1,512,2048,8192]
        [--scan-columns 8,16,32]
    (--gpu-ts "" skips the GPU table, --ts "" the CPU one)
"""
from __future__ import annotations

import argparse
import time

import torch

from delegate.timing import timed
from delegate.ops.gated_delta_rule import gated_delta_rule
from kernels_cpu.threadpool import set_num_threads

B, H, K, V = 1, 16, 128, 128
NAIVE_MAX_T = 512          # longer T: the token loop is timed here and scaled linearly


def make_inputs(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, T, K, generator=g),
        torch.nn.functional.normalize(torch.randn(B, H, T, K, generator=g), dim=-1),
        torch.randn(B, H, T, V, generator=g),
        torch.rand(B, H, T, K, generator=g).clamp_(min=1e-3),
        torch.rand(B, H, T, generator=g),
        torch.randn(B, H, K, V, generator=g),
    )


def naive_token_loop(q, k, v, d, beta, s0):
    """One token at a time, the recurrence as written (float32)."""
    S, out = s0.clone(), torch.empty(*q.shape[:3], v.shape[-1])
    for t in range(q.shape[2]):
        S.mul_(d[:, :, t].unsqueeze(-1))
        pred = (k[:, :, t].unsqueeze(-2) @ S).squeeze(-2)
        delta = (v[:, :, t] - pred) * beta[:, :, t].unsqueeze(-1)
        S.add_(k[:, :, t].unsqueeze(-1) * delta.unsqueeze(-2))
        out[:, :, t] = (q[:, :, t].unsqueeze(-2) @ S).squeeze(-2)
    return out, S


def min_ms(fn, reps: int) -> float:
    return timed(fn, reps)[1]


def sgemm_gflops(reps: int = 10) -> float:
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    return 2 * 1024 ** 3 / min_ms(lambda: torch.mm(a, b), reps) / 1e6


def flops(T: int) -> float:
    """Useful flops of the recurrence: decay, prediction, update, readout per token."""
    return T * H * K * V * 7.0


def et_runtime():
    """ExecuTorch's C++ op and thread pool, for the CPU table only: the device machine's torch
    has no matching ExecuTorch C++ build, and the GPU table needs neither."""
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  registers llama ops
    from executorch.extension.pybindings import portable_lib

    return portable_lib


def set_threads(n: int) -> None:
    set_num_threads(n)
    et_runtime()._unsafe_reset_threadpool(n)
    torch.set_num_threads(n)


class _ChannelwiseOp(torch.nn.Module):
    def forward(self, q, k, v, d, beta, s0):
        return torch.ops.llama.channelwise_gated_delta_rule(q, k, v, d, beta, s0)


def runner_method(x):
    """(program, method): the op exported and lowered for device="cpu", loaded through our
    Python runner, as a user runs the .pte; the caller destroys the program."""
    from delegate.aot import lower
    from delegate.runtime.program import Runtime

    pm = lower(_ChannelwiseOp(), x, device="cpu")
    prog = Runtime.get().load_program(pm.buffer, device="cpu")
    return prog, prog.load_method("forward")


def bench_row(T: int, n: int, reps: int) -> dict:
    x = make_inputs(T)
    et = torch.ops.llama.channelwise_gated_delta_rule
    ours = min_ms(lambda: gated_delta_rule(*x), reps)
    theirs = min_ms(lambda: et(*x), reps)
    ours = min(ours, min_ms(lambda: gated_delta_rule(*x), reps))   # interleave against noise
    prog, method = runner_method(x)
    try:
        args = list(x)
        runner = min(min_ms(lambda: method.execute(args), reps) for _ in range(2))
    finally:
        prog.destroy()
    tn = min(T, NAIVE_MAX_T)
    xn = make_inputs(tn)
    naive = min_ms(lambda: naive_token_loop(*xn), max(1, reps // 2)) * T / tn
    return dict(T=T, threads=n, ours=ours, runner=runner, et=theirs, naive=naive,
                extrapolated=tn < T, gflops=flops(T) / ours / 1e6)


# ---- GPU: our WGSL kernel and FLA ----------------------------------------------------------
GPU_WARM_S = 0.3     # an idle GPU drops its clocks between short submits: warm it first


def webgpu_ms(x, runs: int) -> tuple:
    """(GPU ms of one call, clock kind, {kernel label: ms}) through a single-op graph."""
    from delegate.ir import Graph, Node, TensorValue
    from delegate.ops.gated_delta_rule import infer_shapes
    from delegate.runtime.webgpu_executor import WebGpuExecutor

    g = Graph()
    g.inputs = [g.add_value(TensorValue(torch.float32, tuple(t.shape), tuple(t.shape))) for t in x]
    shapes = infer_shapes([tuple(t.shape) for t in x])
    g.outputs = [g.add_value(TensorValue(torch.float32, tuple(s), tuple(s))) for s in shapes]
    g.nodes.append(Node("gated_delta_rule", list(g.inputs), list(g.outputs), {}))
    ex = WebGpuExecutor(g, {})
    try:
        t_end = time.perf_counter() + GPU_WARM_S
        ex.execute(list(x))
        while time.perf_counter() < t_end:
            ex.execute(list(x))
        best, per, clock = float("inf"), {}, "gpu"
        for _ in range(runs):
            _, times, clock = ex.execute_profiled(list(x))
            total = sum(s for _, s in times)
            if total < best:
                best, per = total, {}
                for label, sec in times:
                    per[label] = per.get(label, 0.0) + sec * 1e3
        return best * 1e3, clock, per
    finally:
        ex.destroy()


def fla_ms(x, runs: int) -> str:
    """FLA's kernel on CUDA in ms (as text), or 'n/a (why)'."""
    if not torch.cuda.is_available():
        return "n/a (no CUDA)"
    try:
        from fla.ops.gated_delta_rule import (chunk_gated_delta_rule,
                                              fused_recurrent_gated_delta_rule)
    except Exception as e:  # fla missing or its triton does not import
        return f"n/a ({type(e).__name__})"
    q, k, v, d, beta, s0 = (t.cuda() for t in x)
    # FLA: [B, T, H, *] layouts, log gate per head
    q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    g = d.log().mean(-1).transpose(1, 2).contiguous()
    beta = beta.transpose(1, 2).contiguous()
    fn = fused_recurrent_gated_delta_rule if q.shape[1] == 1 else chunk_gated_delta_rule

    def call():
        return fn(q, k, v, g, beta, scale=1.0, initial_state=s0, output_final_state=True)

    try:
        call()
        t_end = time.perf_counter() + GPU_WARM_S
        while time.perf_counter() < t_end:
            call()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(runs):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call()
            b.record()
            torch.cuda.synchronize()
            best = min(best, a.elapsed_time(b))
    except Exception as e:  # an fla/triton version this call does not fit
        return f"n/a ({type(e).__name__}: {str(e)[:60]})"
    return f"{best:.4f}"


def gpu_table(ts, scan_columns=None) -> None:
    from kernels_wgsl import gated_delta_rule as gdr
    from kernels_wgsl.device import get_device

    default = gdr.SCAN_COLUMNS
    if scan_columns:   # the forced width first, the narrower defaults where it does not fit
        gdr.SCAN_COLUMNS = (scan_columns,) + tuple(c for c in default if c < scan_columns)
    limit = get_device().limits.get("max-compute-workgroup-storage-size", gdr.WORKGROUP_BYTES)
    tile = gdr.scan_tile(gdr.Heads(K, V, 1, K), limit)
    print(f"\ngated_delta_rule on the GPU  B={B} H={H} K={K} V={V} fp32 channelwise; "
          f"adapter {get_device().name}; chunk_scan {tile.bv} columns x {tile.tc} staged rows "
          f"per workgroup ({B * H * -(-V // tile.bv)} workgroups)")
    print(f"{'T':>5} {'webgpu ms':>10} {'clock':>5} {'FLA ms':>10} {'ratio':>6}  kernels (ms)")
    for T in ts:
        x = make_inputs(T)
        ours, clock, per = webgpu_ms(x, 10 if T <= 512 else 5)
        fla = fla_ms(x, 20)
        ratio = f"{ours / float(fla):>6.2f}" if not fla.startswith("n/a") else f"{'-':>6}"
        kernels = ", ".join(f"{k.split(' ')[0]} {v:.4f}" for k, v in per.items())
        print(f"{T:>5} {ours:>10.4f} {clock:>5} {fla:>10} {ratio}  {kernels}")
    print("webgpu: summed GPU time of our dispatches (each in its own timed pass); FLA gets the "
          "per-head mean log decay (scalar gate)")
    gdr.SCAN_COLUMNS = default


def cpu_table(args) -> None:
    print(f"gated_delta_rule  B={B} H={H} K={K} V={V} fp32 channelwise decay; min of runs")
    print(f"{'thr':>3} {'T':>5} {'ours ms':>10} {'runner ms':>10} {'ET C++ ms':>10} {'ratio':>6} "
          f"{'run/ET':>6} {'naive ms':>11} {'GFLOP/s':>8} {'sgemm':>7} {'%sgemm':>6}")
    for n in (int(s) for s in args.threads.split(",")):
        set_threads(n)
        et_threads = et_runtime()._threadpool_get_thread_count()
        peak = sgemm_gflops()
        for T in (int(s) for s in args.ts.split(",")):
            reps = 200 if T == 1 else (5 if T <= 512 else 3)
            r = bench_row(T, n, reps)
            naive = f"{r['naive']:.2f}{'*' if r['extrapolated'] else ' '}"
            print(f"{n:>3} {T:>5} {r['ours']:>10.3f} {r['runner']:>10.3f} {r['et']:>10.3f} "
                  f"{r['ours'] / r['et']:>6.2f} {r['runner'] / r['et']:>6.2f} {naive:>11} "
                  f"{r['gflops']:>8.1f} "
                  f"{peak:>7.1f} {100 * r['gflops'] / peak:>5.1f}%")
        print(f"    (ExecuTorch threadpool threads: {et_threads}; torch.mm GFLOP/s measured "
              f"at {n} thread(s))")
    print(f"* naive loop timed at T={NAIVE_MAX_T} and scaled linearly in T")
    print("GFLOP/s counts 7*T*H*K*V useful flops (decay, k^T S, k delta^T, q^T S)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ts", default="1,128,512,2048,8192")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--gpu-ts", default="1,512,2048,8192")
    ap.add_argument("--scan-columns", default="",
                    help="comma list: one GPU table per chunk_scan column block (default: the "
                         "builder's choice)")
    args = ap.parse_args()
    if args.ts:
        cpu_table(args)
    if args.gpu_ts:
        ts = [int(s) for s in args.gpu_ts.split(",")]
        for bv in [int(s) for s in args.scan_columns.split(",")] if args.scan_columns else [None]:
            gpu_table(ts, bv)


if __name__ == "__main__":
    main()

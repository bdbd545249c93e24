"""linear_q4gsw: our WGSL kernels and CPU kernel, each against a peer measured in the same run.

    Every kernel that can run a shape is timed (GEMV: with and without subgroup sums; GEMM:
    the 64x64 and the 128x128 tile, f16 and f32), the one the builder routes to marked *.

    GEMV (M = 1)   effective bandwidth = packed weight bytes / kernel time, vs a device-to-device
                   copy_buffer_to_buffer (bandwidth = bytes read + bytes written per second)
    GEMM (M > 1)   TFLOP/s = 2*M*N*K / kernel time, vs torch's fp16 matmul on the same GPU
                   (torch.cuda when there is one, else n/a)
    CPU            our tile-dequantize kernel vs torch's packed int4 kernel
                   (aten._weight_int4pack_mm_for_cpu, float32 activations), same threads

Shapes (K, N) are Llama-3.2-1B's projections and its LM head; group size 32 for all.
GPU times come from timestamp queries around a pass of REPS back-to-back dispatches when the
adapter offers them (wall time over the same submit is printed beside them), else wall time.
Weights rotate through enough copies to overflow the GPU's last-level cache, so GEMV reads
come from memory, as in decode.

    python bench/q4gsw.py            # the full tables (a real GPU)
    python bench/q4gsw.py --quick    # small subset for lavapipe / CPU-only machines
    ETWGPU_ADAPTER=nvidia python bench/q4gsw.py --skip-cpu
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from delegate.timing import timed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from anywhere

SHAPES = [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (2048, 128256)]
GEMM_MS = (128, 512, 2048)
GROUP = 32
ROTATE_BYTES = 256 << 20      # weight copies cycled per timing: > any GPU's L2


# ---- WebGPU plumbing ---------------------------------------------------------------------------
class Gpu:
    def __init__(self):
        import wgpu
        from kernels_wgsl.device import get_device

        self.wgpu = wgpu
        self.dev = get_device()
        self.device = self.dev.device
        self._keys = []
        self._fence = self.buffer(16)
        self.warm_s, self.trials = 0.3, 3

    def buffer(self, nbytes: int, data: bytes | None = None, extra=0):
        usage = (self.wgpu.BufferUsage.STORAGE | self.wgpu.BufferUsage.COPY_SRC
                 | self.wgpu.BufferUsage.COPY_DST | extra)
        if data is not None:
            return self.device.create_buffer_with_data(data=data, usage=usage)
        return self.device.create_buffer(size=max(16, nbytes), usage=usage)

    def bound(self, spec, buffers: list, params: bytes):
        """(pipeline, bind group) of one Dispatch spec over buffers [operand 0, 1, ...]."""
        import kernels_wgsl

        key, pipeline, layout = self.dev.acquire_pipeline(
            kernels_wgsl.source(spec.shader, spec.prelude), spec.entry, spec.constants, spec.kinds())
        self._keys.append(key)
        uniform = self.device.create_buffer_with_data(
            data=params, usage=self.wgpu.BufferUsage.UNIFORM)
        dummy = self.buffer(16)
        resources = [uniform] + [dummy if a is None else buffers[a] for a in spec.args]
        entries = [{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                   for i, b in enumerate(resources)]
        return pipeline, self.device.create_bind_group(layout=layout, entries=entries)

    def fold(self, count: int) -> tuple:
        most = self.dev.limits["max-compute-workgroups-per-dimension"]
        y = -(-count // most)
        return (-(-count // y), y)

    def time(self, encode, reps: int, copies: bool = False) -> tuple:
        """(timestamp seconds per rep or None, wall seconds per rep), best of self.trials.

        encode(encoder, compute_pass, rep) records one rep: dispatches into compute_pass, or,
        for copies, encoder-level commands (compute_pass is None). The same work runs for
        WARM_S first: a GPU left idle between short submits drops its clocks (an H200 fell
        from 1980 to 345 MHz), which would time the clock governor, not the kernel."""
        wgpu = self.wgpu
        ts = self.dev.has_timestamps
        qs = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=2) if ts else None
        t_end = time.perf_counter() + self.warm_s
        self._submit(encode, 1, None, copies)
        while time.perf_counter() < t_end:
            self._submit(encode, reps, None, copies)
        best_ts, best_wall = float("inf"), float("inf")
        for _ in range(self.trials):
            t0 = time.perf_counter()
            self._submit(encode, reps, qs, copies)
            best_wall = min(best_wall, (time.perf_counter() - t0) / reps)
            if ts:
                best_ts = min(best_ts, self._read_timestamps(qs) / reps)
        return (best_ts if ts else None), best_wall

    def _read_timestamps(self, qs) -> float:
        enc = self.device.create_command_encoder()
        out = self.buffer(16, extra=self.wgpu.BufferUsage.QUERY_RESOLVE)
        enc.resolve_query_set(qs, 0, 2, out, 0)
        self.device.queue.submit([enc.finish()])
        t = memoryview(self.device.queue.read_buffer(out)).cast("Q")
        out.destroy()
        return (t[1] - t[0]) * 1e-9   # wgpu reports nanoseconds on Vulkan

    def _submit(self, encode, reps: int, qs, copies: bool) -> None:
        enc = self.device.create_command_encoder()
        if not copies:
            writes = ({"query_set": qs, "beginning_of_pass_write_index": 0,
                       "end_of_pass_write_index": 1} if qs else None)
            cp = enc.begin_compute_pass(timestamp_writes=writes)
            for r in range(reps):
                encode(enc, cp, r)
            cp.end()
        else:   # copies: bracket them with two empty timed compute passes
            if qs:
                enc.begin_compute_pass(timestamp_writes={"query_set": qs,
                                                         "end_of_pass_write_index": 0}).end()
            for r in range(reps):
                encode(enc, None, r)
            if qs:
                enc.begin_compute_pass(timestamp_writes={"query_set": qs,
                                                         "beginning_of_pass_write_index": 1}).end()
        self.device.queue.submit([enc.finish()])
        self.device.queue.read_buffer(self._fence)   # returns once the GPU is done

    def release(self):
        for k in self._keys:
            self.dev.release_pipeline(k)


def q4_operands(gpu: Gpu, m: int, k: int, n: int, copies: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g).view(torch.int32)
    n_pad = -(-n // 4) * 4
    scales = torch.rand(k // GROUP, n_pad, generator=g) * 0.02
    x = torch.randn(m, k, generator=g)
    data = packed.numpy().tobytes()
    return ([gpu.buffer(0, data) for _ in range(copies)], gpu.buffer(0, scales.numpy().tobytes()),
            gpu.buffer(0, x.numpy().tobytes()), gpu.buffer(m * n * 4), (x, packed, scales))


def q4_specs(gpu: Gpu, m: int, k: int, n: int) -> list:
    """[(Dispatch, routed)]: every kernel that can run M = m on this device (GEMV for m == 1,
    both GEMM tiles in each precision the device has otherwise), routed = the builder's pick."""
    import kernels_wgsl
    from kernels_wgsl import q4gsw as wq

    attrs = {"group_size": GROUP, "K": k, "N": n}
    ins = [(m, k), (n, k // 8), (k // GROUP, -(-n // 4) * 4), None]
    info = kernels_wgsl.BuildInfo(gpu.dev, (torch.float32, torch.int32, torch.float32, None))
    routed = next(s.label for s in wq.linear_q4gsw(ins, [(m, n)], attrs, info)
                  if s.sizes(ins, [(m, n)], attrs)[1] > 0)
    epi = wq.bias_epilogue(False)
    always = lambda m, n: True  # noqa: E731
    if m == 1:
        specs = [wq.coop_gemv(sg, n, epi, always)
                 for sg in ((False, True) if gpu.dev.has_subgroups else (False,))]
    else:
        specs = [wq.steel_gemm(tile, f16, n, epi, always)
                 for tile in (wq.TILE, wq.TILE128)
                 for f16 in ((True, False) if gpu.dev.has_f16 else (False,))
                 if tile == wq.TILE or wq.tile128_fits(gpu.dev, f16)]
    return [(s, s.label == routed) for s in specs]


def time_q4(gpu: Gpu, spec, m: int, k: int, n: int, reps: int, check: bool = False):
    """(seconds per call by timestamps or None, by wall time) of one kernel spec."""
    packed_bytes = n * k // 2
    copies = max(1, min(8, ROTATE_BYTES // packed_bytes)) if m == 1 else 1
    packs, scales, x, out, host = q4_operands(gpu, m, k, n, copies)
    attrs = {"group_size": GROUP, "K": k, "N": n}
    ins = [(m, k), (n, k // 8), (k // GROUP, -(-n // 4) * 4), None]
    params, count = spec.sizes(ins, [(m, n)], attrs)
    grid = gpu.fold(count)
    bound = [gpu.bound(spec, [x, p, scales, None, out], params) for p in packs]

    def encode(enc, cp, r):
        pipeline, bind_group = bound[r % len(bound)]
        cp.set_pipeline(pipeline)
        cp.set_bind_group(0, bind_group)
        cp.dispatch_workgroups(*grid)

    t_ts, t_wall = gpu.time(encode, reps)
    if check:
        _check(gpu, out, host, m, n, k)
    for b in packs + [scales, x, out]:
        b.destroy()
    return t_ts, t_wall


def _check(gpu, out, host, m, n, k):
    x, packed, scales = host
    nib = packed.view(torch.uint8).view(n, k // 2)
    q = torch.stack([nib & 15, nib >> 4], -1).view(n, k).double() - 8
    w = q * scales[:, :n].t().double().repeat_interleave(GROUP, 1)
    want = x.double() @ w.t()
    got = torch.frombuffer(bytearray(gpu.device.queue.read_buffer(out)), dtype=torch.float32)
    err = (got.view(m, n).double() - want).abs().max().item() / max(1e-9, want.abs().max().item())
    if err > 1e-2:
        raise SystemExit(f"q4gsw {m}x{n}x{k}: expected the dequant-matmul result, "
                         f"got relative error {err}")


def time_copy(gpu: Gpu, nbytes: int, reps: int):
    src, dst = gpu.buffer(nbytes), gpu.buffer(nbytes)

    def encode(enc, cp, r):
        enc.copy_buffer_to_buffer(src, 0, dst, 0, nbytes)

    t = gpu.time(encode, reps, copies=True)
    src.destroy()
    dst.destroy()
    return t


def torch_copy_bw(nbytes: int, reps: int = 20):
    """torch.cuda device-to-device copy, bytes read + written per second (a second peer)."""
    if not torch.cuda.is_available():
        return None
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * nbytes * reps / (start.elapsed_time(end) * 1e-3)


def torch_fp16_tflops(m: int, k: int, n: int, reps: int):
    if not torch.cuda.is_available():
        return None
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * m * n * k / (start.elapsed_time(end) * 1e-3 / reps) / 1e12


# ---- tables ------------------------------------------------------------------------------------
def _name(spec, routed: bool) -> str:
    return (spec.label or spec.entry) + (" *" if routed else "")


def _best(t_ts, t_wall):
    return t_ts if t_ts is not None else t_wall


def gpu_tables(args) -> None:
    gpu = Gpu()
    if args.quick:
        gpu.warm_s, gpu.trials = 0.0, 1
    shapes = SHAPES if not args.quick else [(2048, 2048), (2048, 512)]
    print(f"# WebGPU adapter: {gpu.dev.name}; shader-f16 {gpu.dev.has_f16}; "
          f"timestamps {gpu.dev.has_timestamps}")
    reps = 3 if args.quick else 50
    copy_bytes = min(ROTATE_BYTES, gpu.dev.limits["max-storage-buffer-binding-size"])
    c_ts, c_wall = time_copy(gpu, copy_bytes, reps)
    copy_bw = 2 * copy_bytes / _best(c_ts, c_wall)
    print(f"copy_buffer_to_buffer {copy_bytes >> 20} MiB: {copy_bw / 1e9:.1f} GB/s (read + write)"
          f"{'' if c_ts is None else f'; wall {2 * copy_bytes / c_wall / 1e9:.1f} GB/s'}")
    tc = torch_copy_bw(copy_bytes)
    print(f"torch.cuda copy {copy_bytes >> 20} MiB: "
          f"{'n/a' if tc is None else f'{tc / 1e9:.1f} GB/s (read + write)'}\n")

    print("GEMV (M = 1), packed weight bytes per second; * = the kernel the builder routes to")
    print(f"{'K':>6} {'N':>7} {'weights MiB':>12} {'kernel':>26} {'us':>9} {'wall us':>9} "
          f"{'GB/s':>8} {'% copy':>7} {'% torch copy':>13}")
    for k, n in shapes:
        for spec, routed in q4_specs(gpu, 1, k, n):
            t_ts, t_wall = time_q4(gpu, spec, 1, k, n, reps, check=n * k <= 2048 * 8192)
            t = _best(t_ts, t_wall)
            bw = n * k / 2 / t
            print(f"{k:>6} {n:>7} {n * k / 2 / 2**20:>12.2f} {_name(spec, routed):>26} "
                  f"{'-' if t_ts is None else f'{t_ts * 1e6:.1f}':>9} {t_wall * 1e6:>9.1f} "
                  f"{bw / 1e9:>8.1f} {100 * bw / copy_bw:>6.1f}% "
                  f"{'n/a' if tc is None else f'{100 * bw / tc:.1f}%':>13}")

    ms = GEMM_MS if not args.quick else (128,)
    gemm_shapes = shapes if not args.quick else [(2048, 512)]
    print("\nGEMM, TFLOP/s = 2*M*N*K / time; torch = fp16 matmul on the same GPU; * = routed")
    print(f"{'M':>5} {'K':>6} {'N':>7} {'kernel':>26} {'us':>10} {'TFLOP/s':>9} {'torch':>8} "
          f"{'ratio':>6}")
    for m in ms:
        for k, n in gemm_shapes:
            flops = 2 * m * n * k
            r = max(2, min(reps, int(2e12 / flops))) if not args.quick else 2
            ref = torch_fp16_tflops(m, k, n, 20)
            for spec, routed in q4_specs(gpu, m, k, n):
                t_ts, t_wall = time_q4(gpu, spec, m, k, n, r,
                                       check=m * n * k <= 512 * 2048 * 8192)
                tf = flops / _best(t_ts, t_wall) / 1e12
                print(f"{m:>5} {k:>6} {n:>7} {_name(spec, routed):>26} "
                      f"{_best(t_ts, t_wall) * 1e6:>10.1f} {tf:>9.3f} "
                      f"{'n/a' if ref is None else f'{ref:.1f}':>8} "
                      f"{'n/a' if ref is None else f'{tf / ref:.3f}':>6}")
    gpu.release()


def cpu_table(args) -> None:
    import kernels_cpu
    from kernels_cpu import q4gsw  # noqa: F401  (registers the kernel)
    from kernels_cpu.threadpool import ScratchArena, get_pool, single_threaded_torch

    k, n = (2048, 2048)
    g = torch.Generator().manual_seed(0)
    qdata = torch.randint(-8, 8, (n, k), dtype=torch.int32, generator=g)
    scale = torch.rand(n, k // GROUP, generator=g) * 0.02
    nib = (qdata + 8).to(torch.uint8)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).contiguous().view(torch.int32)
    scales = scale.t().contiguous()
    kernel = kernels_cpu.get_kernel("linear_q4gsw")
    attrs = {"group_size": GROUP, "K": k, "N": n}
    threads = get_pool().num_threads
    arena = ScratchArena(kernel.scratch_nbytes([], attrs, threads))
    tinygemm = torch.ops.aten._convert_weight_to_int4pack_for_cpu(qdata + 8, 2)
    scale_zeros = torch.stack([scales, torch.zeros_like(scales)], -1).contiguous()
    print(f"\nCPU, K = N = {k}, group {GROUP}, {threads} threads; ms = min over runs")
    print(f"{'M':>4} {'tile dequant (ours)':>20} {'torch int4pack fp32':>20} {'max |diff|':>11}")
    for m in ((1, 64) if args.quick else (1, 16, 64, 128)):
        x = torch.randn(m, k, generator=g)
        out = torch.empty(m, n)

        def ours():
            with single_threaded_torch():
                kernel.fn([x, packed, scales, None], [out], attrs, arena.reserve(arena.nbytes))

        def theirs():
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x, tinygemm, GROUP, scale_zeros)

        t_ours = _min_ms(ours, 3 if args.quick else 10)
        t_theirs = _min_ms(theirs, 1 if args.quick or m > 16 else 5)
        diff = (out - theirs()).abs().max().item()
        print(f"{m:>4} {t_ours:>17.2f} ms {t_theirs:>17.2f} ms {diff:>11.2e}")


def _min_ms(fn, reps: int) -> float:
    return timed(fn, reps)[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small subset (lavapipe / CPU)")
    ap.add_argument("--skip-cpu", action="store_true")
    ap.add_argument("--skip-gpu", action="store_true")
    args = ap.parse_args(argv)
    if not args.skip_gpu:
        gpu_tables(args)
    if not args.skip_cpu:
        cpu_table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

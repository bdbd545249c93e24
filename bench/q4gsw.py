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

--sweep-gemv times every GemvConfig (kernels_wgsl/q4gsw.py) at each GEMV shape of a
Llama-3.2-1B decode step, with the device's cross-lane sums, weights and scales both rotating
(up to 128 copies), each output checked against fp64. Per shape: the configs by time; whether
each layout's schedules agree bit for bit (the fused op relies on it). Per K: the layouts
ranked by the decode step's GEMV time, each shape at its fastest schedule, and the routed total.

    python bench/q4gsw.py            # the full tables (a real GPU)
    python bench/q4gsw.py --quick    # small subset for lavapipe / CPU-only machines
    python bench/q4gsw.py --sweep-gemv                 # every GEMV config at the decode shapes
    python bench/q4gsw.py --sweep-gemv --quick --reps 2 --shrink 8   # the same, on lavapipe
    python bench/q4gsw.py --profile-gemv    # the routed GEMV with parts cut: what each costs
    ETWGPU_ADAPTER=nvidia python bench/q4gsw.py --skip-cpu
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from contextlib import contextmanager
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
        specs = [wq.coop_gemv(sg, n, epi, always, wq.gemv_config(k, n, gpu.dev, sg), GROUP)
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


def dequant_reference(host, m: int, n: int, k: int, block: int = 8192) -> torch.Tensor:
    """fp64 dequantize-then-matmul of the host operands, `block` columns at a time."""
    x, packed, scales = host
    nib = packed.view(torch.uint8).view(n, k // 2)
    want = torch.empty(m, n, dtype=torch.float64)
    for n0 in range(0, n, block):
        rows = nib[n0:n0 + block]
        q = torch.stack([rows & 15, rows >> 4], -1).view(len(rows), k).double() - 8
        w = q * scales[:, n0:n0 + block].t().double().repeat_interleave(GROUP, 1)
        want[:, n0:n0 + block] = x.double() @ w.t()
    return want


def relative_error(gpu, out, want: torch.Tensor) -> float:
    got = torch.frombuffer(bytearray(gpu.device.queue.read_buffer(out)), dtype=torch.float32)
    err = (got[:want.numel()].view_as(want).double() - want).abs().max().item()
    return err / max(1e-9, want.abs().max().item())


def _check(gpu, out, host, m, n, k):
    err = relative_error(gpu, out, dequant_reference(host, m, n, k))
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


def torch_matmul_tflops(m: int, k: int, n: int, reps: int, dtype=torch.float16):
    """TFLOP/s of torch's (m x k) @ (k x n) matmul on CUDA in `dtype`, None without CUDA."""
    if not torch.cuda.is_available():
        return None
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
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


def open_gpu(args) -> Gpu:
    gpu = Gpu()
    if args.quick:
        gpu.warm_s, gpu.trials = 0.0, 1
    print(f"# WebGPU adapter: {gpu.dev.name}; shader-f16 {gpu.dev.has_f16}; "
          f"subgroups {gpu.dev.has_subgroups}; timestamps {gpu.dev.has_timestamps}")
    return gpu


def copy_peers(gpu: Gpu, reps: int) -> tuple:
    """(copy_buffer_to_buffer bandwidth, torch.cuda copy bandwidth or None), both printed."""
    copy_bytes = min(ROTATE_BYTES, gpu.dev.limits["max-storage-buffer-binding-size"])
    c_ts, c_wall = time_copy(gpu, copy_bytes, reps)
    copy_bw = 2 * copy_bytes / _best(c_ts, c_wall)
    print(f"copy_buffer_to_buffer {copy_bytes >> 20} MiB: {copy_bw / 1e9:.1f} GB/s (read + write)"
          f"{'' if c_ts is None else f'; wall {2 * copy_bytes / c_wall / 1e9:.1f} GB/s'}")
    tc = torch_copy_bw(copy_bytes)
    print(f"torch.cuda copy {copy_bytes >> 20} MiB: "
          f"{'n/a' if tc is None else f'{tc / 1e9:.1f} GB/s (read + write)'}\n")
    return copy_bw, tc


def gpu_tables(args) -> None:
    gpu = open_gpu(args)
    shapes = SHAPES if not args.quick else [(2048, 2048), (2048, 512)]
    reps = 3 if args.quick else 50
    copy_bw, tc = copy_peers(gpu, reps)

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
            ref = torch_matmul_tflops(m, k, n, 20)
            for spec, routed in q4_specs(gpu, m, k, n):
                t_ts, t_wall = time_q4(gpu, spec, m, k, n, r,
                                       check=m * n * k <= 512 * 2048 * 8192)
                tf = flops / _best(t_ts, t_wall) / 1e12
                print(f"{m:>5} {k:>6} {n:>7} {_name(spec, routed):>26} "
                      f"{_best(t_ts, t_wall) * 1e6:>10.1f} {tf:>9.3f} "
                      f"{'n/a' if ref is None else f'{ref:.1f}':>8} "
                      f"{'n/a' if ref is None else f'{tf / ref:.3f}':>6}")
    gpu.release()


# ---- GEMV sweep (--sweep-gemv) -----------------------------------------------------------------
# (K, N, GEMVs of that shape per Llama-3.2-1B decode step): fused qkv, o, fused gate-up, down,
# the LM head; and 2048 x 8192 (an unfused gate or up), for the pre-sweep figure only.
DECODE_GEMVS = [(2048, 3072, 16), (2048, 2048, 16), (2048, 16384, 16), (8192, 2048, 16),
                (2048, 128256, 1), (2048, 8192, 0)]
SWEEP_LANES = (32, 64, 128, 256, 512, 1024)
MAX_WORDS_IN_FLIGHT = 64   # words * cols * unroll per lane: past it the loads spill registers
SWEEP_ERROR = 1e-4         # relative to max |reference|: an f32 GEMV is ~1e-6 off fp64


def gemv_configs(gpu: Gpu, k: int, subgroups: bool) -> list:
    """Every GemvConfig worth timing at K on this device: no more lanes than chunks, no
    unroll past the chunks a lane has, x staged only for chunks wider than one word."""
    from kernels_wgsl import groups, q4gsw as wq

    out = []
    for words, lanes in itertools.product(wq.GEMV_CHUNKS, SWEEP_LANES):
        chunks = k // (8 * words)
        per_lane = groups(chunks, lanes)
        if lanes > max(32, chunks):
            continue
        for cols, unroll, staged in itertools.product(wq.GEMV_COLS, wq.GEMV_UNROLLS, (False, True)):
            if ((unroll > 1 and unroll >= 2 * per_lane) or (staged and words == 1)
                    or words * cols * unroll > MAX_WORDS_IN_FLIGHT):
                continue
            config = wq.GemvConfig(words, lanes, cols, unroll, staged)
            if config.fits(gpu.dev, subgroups):
                out.append(config)
    return out


def sweep_shapes(shrink: int) -> list:
    """DECODE_GEMVS with K and N divided by `shrink` (K kept a multiple of 64, N of 8)."""
    return [(max(64, k // shrink // 64 * 64), max(8, n // shrink // 8 * 8), count)
            for k, n, count in DECODE_GEMVS]


def gemv_operands(gpu: Gpu, k: int, n: int):
    """([(packed, scales)] copies that together overflow the last-level cache, as decode reads
    both from memory; x; out; the host tensors)."""
    packs, scales_buf, x, out, host = q4_operands(gpu, 1, k, n, 1)
    nbytes = n * k // 2 + host[2].numel() * 4
    copies = [(packs[0], scales_buf)] + [
        (gpu.buffer(0, host[1].numpy().tobytes()), gpu.buffer(0, host[2].numpy().tobytes()))
        for _ in range(max(0, min(127, ROTATE_BYTES // nbytes - 1)))]
    return copies, x, out, host


def time_gemv(gpu: Gpu, spec, k: int, n: int, operands, reps: int):
    """(timestamp s or None, wall s) of one GEMV Dispatch, its output left in `out`."""
    copies, x, out, _ = operands
    attrs = {"group_size": GROUP, "K": k, "N": n}
    params, count = spec.sizes([(1, k), (n, k // 8), None, None], [(1, n)], attrs)
    grid = gpu.fold(count)
    bound = [gpu.bound(spec, [x, packed, scales, None, out], params) for packed, scales in copies]

    def encode(enc, cp, r):
        pipeline, bind_group = bound[r % len(bound)]
        cp.set_pipeline(pipeline)
        cp.set_bind_group(0, bind_group)
        cp.dispatch_workgroups(*grid)

    return gpu.time(encode, reps)


def sweep_shape(gpu: Gpu, k: int, n: int, subgroups: bool, reps: int) -> list:
    """[(config, seconds, wall seconds, relative error, output bytes)] of every config."""
    from kernels_wgsl import q4gsw as wq

    operands = gemv_operands(gpu, k, n)
    want = dequant_reference(operands[3], 1, n, k)
    epi = wq.bias_epilogue(False)
    rows = []
    routed = wq.gemv_config(k, n, gpu.dev, subgroups)
    configs = gemv_configs(gpu, k, subgroups)
    for config in configs + ([routed] if routed not in configs else []):
        spec = wq.coop_gemv(subgroups, n, epi, lambda m, n: True, config, GROUP)
        gpu.device.queue.write_buffer(operands[2], 0, bytes(4 * n))   # no stale bits pass
        t_ts, t_wall = time_gemv(gpu, spec, k, n, operands, reps)
        bits = bytes(gpu.device.queue.read_buffer(operands[2]))
        rows.append((config, _best(t_ts, t_wall), t_wall, relative_error(gpu, operands[2], want),
                     bits))
    for packed, scales in operands[0]:
        packed.destroy()
        scales.destroy()
    operands[1].destroy()
    operands[2].destroy()
    return rows


def print_sweep_rows(k: int, n: int, rows: list, routed, copy_bw: float, tc) -> None:
    print(f"\nGEMV K {k} N {n}: {n * k / 2 / 2**20:.2f} MiB packed; GB/s = packed bytes / time; "
          f"* = routed")
    print(f"{'variant':>20} {'us':>9} {'wall us':>9} {'GB/s':>8} {'% copy':>7} "
          f"{'% torch copy':>13} {'rel err':>9}")
    for config, t, wall, err, _ in sorted(rows, key=lambda r: r[1]):
        bw = n * k / 2 / t
        print(f"{config.name + (' *' if config == routed else ''):>20} {t * 1e6:>9.2f} "
              f"{wall * 1e6:>9.1f} {bw / 1e9:>8.1f} {100 * bw / copy_bw:>6.1f}% "
              f"{'n/a' if tc is None else f'{100 * bw / tc:.1f}%':>13} {err:>9.1e}"
              f"{'' if err <= SWEEP_ERROR else '  WRONG'}")


def layout_bits_agree(rows: list) -> list:
    """Layouts (words, lanes) whose configs gave different output bits: none, or the fused op
    would not match its unfused linears."""
    first, differ = {}, set()
    for config, _, _, _, bits in rows:
        layout = (config.words, config.lanes)
        if first.setdefault(layout, bits) != bits:
            differ.add(layout)
    return sorted(differ)


def best_by_layout(rows: list) -> dict:
    """(words, lanes) -> (seconds, config) of its fastest correct schedule."""
    best = {}
    for config, t, _, err, _ in rows:
        layout = (config.words, config.lanes)
        if err <= SWEEP_ERROR and t < best.get(layout, (float("inf"),))[0]:
            best[layout] = (t, config)
    return best


def print_sweep_summary(results: dict) -> None:
    """Per K, the layouts by decode-step GEMV time (each shape at its fastest schedule), and
    what the router picks now."""
    print("\nDecode step, Llama-3.2-1B GEMV counts: per K, layout w words l lanes with each "
          "shape at its fastest correct schedule (c cols, u unroll, xs x staged); * = routed")
    for k in sorted({k for k, _ in results}):
        shapes = [(n, count, rows, routed) for (kk, n), (count, rows, routed) in results.items()
                  if kk == k and count]
        totals, now = {}, 0.0
        for n, count, rows, routed in shapes:
            now += count * next(t for c, t, *_ in rows if c == routed)
            for layout, (t, config) in best_by_layout(rows).items():
                total, picks = totals.get(layout, (0.0, []))
                totals[layout] = (total + count * t, picks + [f"N {n}: {config.name}"])
        if not shapes:
            continue
        routed_layout = (shapes[0][3].words, shapes[0][3].lanes)
        ranked = sorted(totals.items(), key=lambda kv: kv[1][0])
        for layout, (total, picks) in [kv for i, kv in enumerate(ranked)
                                       if i < 5 or kv[0] == routed_layout]:
            print(f"  K {k} w{layout[0]} l{layout[1]}{' *' if layout == routed_layout else ''}: "
                  f"{total * 1e6:.1f} us ({'; '.join(picks)})")
        print(f"  K {k} as routed now: {now * 1e6:.1f} us")


def gemv_sweep(args) -> None:
    from kernels_wgsl import q4gsw as wq

    gpu = open_gpu(args)
    subgroups = bool(gpu.dev.has_subgroups)
    copy_bw, tc = copy_peers(gpu, args.reps)
    print(f"GEMV sweep, {'subgroupAdd' if subgroups else 'workgroup-memory'} sums, "
          f"min of {gpu.trials} trials of {args.reps} back-to-back dispatches; weights and "
          f"scales rotate through >= {ROTATE_BYTES >> 20} MiB of copies")
    results = {}
    for k, n, count in sweep_shapes(args.shrink):
        routed = wq.gemv_config(k, n, gpu.dev, subgroups)
        rows = sweep_shape(gpu, k, n, subgroups, args.reps)
        print_sweep_rows(k, n, rows, routed, copy_bw, tc)
        differ = layout_bits_agree(rows)
        print("bits: " + (f"DIFFER across the schedules of layouts {differ}" if differ else
                          "each layout gives one output whatever its schedule"))
        results[(k, n)] = (count, rows, routed)
    print_sweep_summary(results)
    gpu.release()


# ---- GEMV profile (--profile-gemv) -------------------------------------------------------------
# Cuts of q4gsw_coop_gemv.wgsl, (text, replacement): the routed GEMV with its weight and scale
# reads cached (one small region, L1 hits), then also its nibble decode dropped, then its eight
# FMAs a word cut to one a chunk. The cut kernels' outputs are wrong by design and go unchecked.
_GROUP_ROW = "    let g = (8u * WORDS * j) / GROUP * (p.n_pad / 4u);"
_QUAD = "    return Quad(packed[r.x + j], packed[r.y + j], packed[r.z + j], packed[r.w + j]);"
_DECODE = ("    let lo = bitcast<vec4<f32>>((vec4<u32>(word) & NIBBLE_MASK) | vec4<u32>(F32_2P23))\n"
           "             - NIBBLE_BIAS;\n"
           "    let hi = bitcast<vec4<f32>>((vec4<u32>(word >> 16u) & NIBBLE_MASK) | vec4<u32>(F32_2P23))\n"
           "             - NIBBLE_BIAS;")
_FIRST_WORD = "    var d = nibble_dot(w.x, xc.a0, xc.b0, 0.0);"
_CHUNK_END = "    return d;\n}\n\nfn quad_dot"
CACHED = ((_GROUP_ROW, "    let g = 0u;"), (_QUAD, _QUAD.replace("+ j]", "+ j % 8u]")))
GEMV_PROFILE = (
    ("full kernel", ()),
    ("weights and scales cached", CACHED),
    ("cached, no nibble decode", CACHED + ((_DECODE, "    let lo = bitcast<vec4<f32>>(vec4<u32>(word));\n"
                                           "    let hi = bitcast<vec4<f32>>(vec4<u32>(word >> 16u));"),)),
    ("cached, one fma a chunk", CACHED + (
        (_FIRST_WORD, "    var d = fma(bitcast<f32>(w.x), xc.a0.x, 0.0);\n    if (false) {"),
        (_CHUNK_END, "    }\n" + _CHUNK_END))))
PROFILE_SHAPES = ((2048, 128256), (8192, 2048), (2048, 2048), (2048, 3072), (2048, 16384))


@contextmanager
def shader_cut(shader: str, cuts):
    """kernels_wgsl.source with each (text, replacement) of cuts made once in `shader`'s text,
    for the pipelines built inside the block (the profiles' deliberately wrong kernels)."""
    import kernels_wgsl

    source = kernels_wgsl.source

    def cut_source(name, prelude=""):
        text = source(name, prelude)
        for old, new in cuts if name == shader else ():
            if old not in text:
                raise SystemExit(f"profile: {shader}.wgsl no longer has {old!r}")
            text = text.replace(old, new, 1)
        return text

    kernels_wgsl.source = cut_source
    try:
        yield
    finally:
        kernels_wgsl.source = source


def gemv_profile(args) -> None:
    """The routed GEMV at the decode shapes with GEMV_PROFILE's cuts: what each part costs."""
    gpu = open_gpu(args)
    print(f"GEMV profile: the routed kernel with parts cut; us, min of {gpu.trials} trials of "
          f"{args.reps} back-to-back dispatches")
    print(f"{'K':>6} {'N':>7} {'kernel':>26} " + " ".join(f"{n:>26}" for n, _ in GEMV_PROFILE))
    for k, n in PROFILE_SHAPES:
        k, n = k // args.shrink, n // args.shrink
        spec = next(s for s, routed in q4_specs(gpu, 1, k, n) if routed)
        row = []
        for _, cuts in GEMV_PROFILE:
            with shader_cut(spec.shader, cuts):
                t_ts, t_wall = time_q4(gpu, spec, 1, k, n, args.reps, check=not cuts)
            row.append(_best(t_ts, t_wall) * 1e6)
        print(f"{k:>6} {n:>7} {spec.label:>26} " + " ".join(f"{t:>26.2f}" for t in row),
              flush=True)
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
    ap.add_argument("--sweep-gemv", action="store_true",
                    help="time every GEMV config at the decode shapes (only this)")
    ap.add_argument("--reps", type=int, default=50, help="dispatches per timed pass (sweep)")
    ap.add_argument("--shrink", type=int, default=1, help="divide the sweep's K and N by this")
    ap.add_argument("--profile-gemv", action="store_true",
                    help="the routed GEMV with its loads cached, decode and FMAs cut (only this)")
    args = ap.parse_args(argv)
    if args.profile_gemv:
        gemv_profile(args)
        return 0
    if args.sweep_gemv:
        gemv_sweep(args)
        return 0
    if not args.skip_gpu:
        gpu_tables(args)
    if not args.skip_cpu:
        cpu_table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

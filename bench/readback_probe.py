"""Where the host time of one WebGPU execute goes, phase by phase (upload, encode, submit,
map wait, copy out), for the Llama-shaped q4gsw layer of bench/overhead.py at a given T.

    python bench/readback_probe.py --t 1,512
    python bench/readback_probe.py --floor     # ways to wait for a readback, and the layer with each
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bench.overhead import llama_layer, load


def phases(ex, x, reps: int = 10) -> dict:
    b = ex.plan.binding_for([x])
    best: dict = {}
    for _ in range(reps):
        t = [time.perf_counter()]
        ex._upload(b, [x])
        t.append(time.perf_counter())
        enc = ex._gpu.device.create_command_encoder()
        ex._encode(enc.begin_compute_pass(), b.payload.dispatches)
        r = b.payload
        for _, src, off, size in r.reads:
            enc.copy_buffer_to_buffer(src, 0, ex._readback, off, size)
        cmd = enc.finish()
        t.append(time.perf_counter())
        ex._gpu.queue.submit([cmd])
        t.append(time.perf_counter())
        raw = ex._gpu.map_read(ex._readback, r.readback_bytes)
        t.append(time.perf_counter())
        out = np.empty(r.readback_bytes // 4, np.float32)
        np.copyto(out, np.frombuffer(raw, np.float32))
        t.append(time.perf_counter())
        ex._gpu.unmap_read(ex._readback)
        t.append(time.perf_counter())
        names = ("upload", "encode", "submit", "map wait + mapped range", "copy out", "unmap")
        for n, a, z in zip(names, t, t[1:]):
            best[n] = min(best.get(n, 1e9), (z - a) * 1e6)
    best["readback MB"] = r.readback_bytes / 2 ** 20
    return best


def _map_sync(buffer, nbytes):
    buffer.map_sync("READ_NOSYNC", 0, nbytes)
    return buffer.read_mapped(0, nbytes, copy=False)


def _poll_here(buffer, nbytes):
    """wgpu-py's promise, resolved by polling in this thread rather than by its poll thread."""
    promise = buffer.map_async("READ_NOSYNC", 0, nbytes)
    buffer._device._poll_wait()
    promise.sync_wait()
    return buffer.read_mapped(0, nbytes, copy=False)


SPIN_S = 1000e-6   # the spin the "native spin" variant tries


def _spun(native, spin_s):
    """native.map with spin_s of non-blocking polls before it blocks."""
    def map_(buffer, nbytes):
        native.spin_s, saved = spin_s, native.spin_s
        try:
            return native.map(buffer, nbytes)
        finally:
            native.spin_s = saved
    return map_


def _waits(gpu):
    """name -> (map, unmap): GpuDevice's native calls blocking at once and after a spin,
    wgpu-py's map_sync, and wgpu-py's promise with the poll in this thread."""
    native = gpu._native_map
    return {"native": (_spun(native, 0.0), native.unmap),
            "native spin": (_spun(native, SPIN_S), native.unmap),
            "map_sync": (_map_sync, lambda b: b.unmap()),
            "wgpu-py poll here": (_poll_here, lambda b: b.unmap())}


def floor(reps: int = 300) -> None:
    """Copy nbytes on the GPU, submit, wait and read them, each way of _waits; min, median µs."""
    import wgpu
    from kernels_wgsl.device import get_device

    gpu = get_device()
    u = wgpu.BufferUsage
    for nbytes in (16, 8192):
        src = gpu.device.create_buffer(size=nbytes, usage=u.STORAGE | u.COPY_SRC | u.COPY_DST)
        dst = gpu.device.create_buffer(size=nbytes, usage=u.MAP_READ | u.COPY_DST)
        times: dict = {name: [] for name in _waits(gpu)}
        for _ in range(reps):
            for name, (map_, unmap) in _waits(gpu).items():
                t0 = time.perf_counter()
                enc = gpu.device.create_command_encoder()
                enc.copy_buffer_to_buffer(src, 0, dst, 0, nbytes)
                gpu.queue.submit([enc.finish()])
                np.frombuffer(map_(dst, nbytes), np.uint8).sum()
                unmap(dst)
                times[name].append((time.perf_counter() - t0) * 1e6)
        print(f"copy {nbytes} B + submit + wait + read: " + ", ".join(
            f"{k} min {min(v):.1f} median {np.median(v):.1f}" for k, v in times.items()),
            flush=True)


def layer_waits(reps: int = 200) -> None:
    """The Llama-shaped layer at T=1, executed with the native map (blocking at once, and after
    a spin) and with map_sync, interleaved."""
    prog, m = load(llama_layer(), "webgpu")
    (_, ex), = m.delegates
    x = torch.randn(1, 1, 2048)
    native = ex._gpu._native_map
    saved = native.spin_s
    ways = (("native", native, 0.0), ("native spin", native, SPIN_S), ("map_sync", None, saved))
    times: dict = {name: [] for name, _, _ in ways}
    end = time.perf_counter() + 1.5
    while time.perf_counter() < end:   # clocks up
        m.execute([x])
    try:
        for _ in range(reps):
            for name, way, spin in ways:
                ex._gpu._native_map = way
                native.spin_s = spin
                t0 = time.perf_counter()
                m.execute([x])
                times[name].append((time.perf_counter() - t0) * 1e6)
    finally:
        ex._gpu._native_map, native.spin_s = native, saved
    print("layer T=1 execute: " + ", ".join(
        f"{k} min {min(v):.1f} median {np.median(v):.1f}" for k, v in times.items()), flush=True)
    prog.destroy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", default="1,512")
    ap.add_argument("--floor", action="store_true")
    args = ap.parse_args()
    if args.floor:
        floor()
        layer_waits()
        return
    prog, m = load(llama_layer(), "webgpu")
    (_, ex), = m.delegates
    for t in (int(s) for s in args.t.split(",")):
        x = torch.randn(1, t, 2048)
        m.execute([x])
        print(f"T={t}: " + ", ".join(f"{k} {v:.1f}" for k, v in phases(ex, x).items()), flush=True)
    prog.destroy()


if __name__ == "__main__":
    main()

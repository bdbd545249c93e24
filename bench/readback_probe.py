"""Where the host time of one WebGPU execute goes, phase by phase (upload, encode, submit,
map wait, copy out), for the Llama-shaped q4gsw layer of bench/overhead.py at a given T.

    python bench/readback_probe.py --t 1,512
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
        ex._readback.map_sync("READ_NOSYNC", 0, r.readback_bytes)
        t.append(time.perf_counter())
        raw = ex._readback.read_mapped(0, r.readback_bytes, copy=False)
        out = np.empty(r.readback_bytes // 4, np.float32)
        np.copyto(out, np.frombuffer(raw, np.float32))
        t.append(time.perf_counter())
        ex._readback.unmap()
        t.append(time.perf_counter())
        names = ("upload", "encode", "submit", "map wait", "copy out", "unmap")
        for n, a, z in zip(names, t, t[1:]):
            best[n] = min(best.get(n, 1e9), (z - a) * 1e6)
    best["readback MB"] = r.readback_bytes / 2 ** 20
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", default="1,512")
    args = ap.parse_args()
    prog, m = load(llama_layer(), "webgpu")
    (_, ex), = m.delegates
    for t in (int(s) for s in args.t.split(",")):
        x = torch.randn(1, t, 2048)
        m.execute([x])
        print(f"T={t}: " + ", ".join(f"{k} {v:.1f}" for k, v in phases(ex, x).items()), flush=True)
    prog.destroy()


if __name__ == "__main__":
    main()

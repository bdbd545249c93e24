"""Host overhead of an execute, against peers measured in the same run.

    python bench/overhead.py [--only one_op,chain,block,llama] [--devices cpu,webgpu]

- one_op: `x + 1` through our runner on cpu, against ExecuTorch's C++ runtime on the same
  model lowered to XNNPACK.
- chain: 64 tiny elementwise ops; host µs per node (cpu: beyond the kernels' own time, timed
  by calling the same prepared kernels directly) and per dispatch (webgpu: wall minus the GPU
  timestamps' sum).
- block: transformer block d=512 / 8 heads / FFN 1536 at T=128 on cpu, against XNNPACK through
  ExecuTorch's C++ runtime and eager torch, at 2 threads.
- llama: one Llama-3.2-1B-shaped decoder layer (hidden 2048, 32/8 heads of 64, SwiGLU 8192,
  torchao int4 group 32) at T=1 and T=512 on webgpu: wall against summed GPU time.
Every figure is the minimum over repeated runs (the machine is shared and noisy).
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch

from delegate.aot import lower
from delegate.models import TransformerBlock, seeded
from delegate.runtime.program import Runtime
from delegate.timing import timed


def min_us(fn, runs: int, repeat: int = 5) -> float:
    """Min over `repeat` batches of the mean of `runs` calls, in µs (timer cost amortised)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        best = min(best, (time.perf_counter() - t0) / runs)
    return best * 1e6


def load(pte: bytes, device: str):
    prog = Runtime.get().load_program(pte, device=device)
    return prog, prog.load_method("forward")


def xnnpack_pte(model, inputs, dynamic_shapes=None) -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(model, tuple(inputs), dynamic_shapes=dynamic_shapes)
    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer


_KEEP = []   # the C++ module reads the buffer in place: keep it alive


def et_module(pte: bytes):
    from executorch.extension.pybindings import portable_lib

    _KEEP.append(pte)
    return portable_lib._load_for_executorch_from_buffer(pte)


class AddOne(torch.nn.Module):
    def forward(self, x):
        return x + 1


class Chain(torch.nn.Module):
    """64 tiny elementwise nodes: no op fuses or folds away."""

    def forward(self, x):
        for i in range(16):
            x = torch.relu(x * 1.01 + 0.5) - 0.25
        return x


def one_op(args) -> list:
    x = torch.randn(4, 3)
    ours = lower(AddOne(), (x,), device="cpu").buffer
    et = et_module(xnnpack_pte(AddOne(), (x,)))
    prog, m = load(ours, "cpu")
    t_ours = min_us(lambda: m.execute([x]), 2000)
    t_et = min_us(lambda: et.forward([x]), 2000)
    t_ours = min(t_ours, min_us(lambda: m.execute([x]), 2000))   # interleaved against noise
    prog.destroy()
    return [("1-op x+1, runner cpu", t_ours, "µs"), ("1-op x+1, ET C++ XNNPACK", t_et, "µs"),
            ("ratio ours / ET", t_ours / t_et, "x")]


def _kernel_only_us(executor, x) -> float:
    """The same prepared kernel calls, called straight (what a node costs without us)."""
    b = executor.plan.binding_for([x])
    calls, scratch = b.payload.calls, executor._scratch_view

    def run():
        for fn, ins, outs, attrs in calls:
            fn(ins, outs, attrs, scratch)
    return min_us(run, 500)


def chain(args) -> list:
    x = torch.randn(8, 16)
    rows = []
    for device in args.devices:
        prog, m = load(lower(Chain(), (x,), device=device).buffer, device)
        (_, executor), = m.delegates
        nodes = len(executor.graph.nodes)
        wall = min_us(lambda: m.execute([x]), 300 if device == "cpu" else 30)
        if device == "cpu":
            kern = _kernel_only_us(executor, x)
            rows += [(f"chain {nodes} nodes cpu: wall", wall, "µs"),
                     ("  kernels called directly", kern, "µs"),
                     ("  overhead per node", (wall - kern) / nodes, "µs")]
        else:
            gpu = _gpu_us(executor, x)
            n = len(executor.plan.binding_for([x]).payload.dispatches)
            rows += [(f"chain {n} dispatches webgpu: wall", wall, "µs"),
                     ("  GPU timestamps sum", gpu, "µs"),
                     ("  host per dispatch ((wall - GPU) / dispatches)", (wall - gpu) / n, "µs")]
        prog.destroy()
    return rows


def _gpu_us(executor, x) -> float:
    best = float("inf")
    for _ in range(3):
        _, times, clock = executor.execute_profiled([x])
        best = min(best, sum(t for _, t in times))
    return best * 1e6


def block(args) -> list:
    torch.manual_seed(0)
    model = seeded(TransformerBlock(512, 8, 1536))
    x = torch.randn(1, 128, 512)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    from executorch.extension.pybindings import portable_lib
    from kernels_cpu.threadpool import set_num_threads
    set_num_threads(2)
    portable_lib._unsafe_reset_threadpool(2)
    prog, m = load(lower(model, (x,), device="cpu").buffer, "cpu")
    et = et_module(xnnpack_pte(model, (x,)))
    with torch.no_grad():
        eager = min_us(lambda: model(x), 10)
    ours = min_us(lambda: m.execute([x]), 10)
    xnn = min_us(lambda: et.forward([x]), 10)
    ours = min(ours, min_us(lambda: m.execute([x]), 10))
    prog.destroy()
    torch.set_num_threads(threads)
    return [("block d512 T128 cpu 2 thr: ours", ours / 1e3, "ms"),
            ("  XNNPACK (ET C++)", xnn / 1e3, "ms"), ("  eager torch", eager / 1e3, "ms"),
            ("  ratio ours / XNNPACK", ours / xnn, "x")]


def llama_layer(max_seq: int = 2048):
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    model = seeded(TransformerBlock(2048, 32, 8192, kv_heads=8))
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    seq = torch.export.Dim("seq", min=1, max=max_seq)
    return lower(model, (torch.randn(1, 16, 2048),), dynamic_shapes=({1: seq},),
                 device="webgpu").buffer


def llama(args) -> list:
    prog, m = load(llama_layer(), "webgpu")
    (_, executor), = m.delegates
    rows = []
    for t in (1, 512):
        x = torch.randn(1, t, 2048)
        _, wall = timed(lambda: m.execute([x]), 20 if t == 1 else 5)
        gpu = _gpu_us(executor, x)
        n = len(executor.plan.binding_for([x]).payload.dispatches)
        rows += [(f"llama layer T={t} webgpu: wall", wall * 1e3, "µs"),
                 (f"  GPU timestamps sum ({n} dispatches)", gpu, "µs"),
                 ("  wall / GPU", wall * 1e3 / gpu, "x"),
                 ("  host per execute (wall - GPU)", wall * 1e3 - gpu, "µs")]
    prog.destroy()
    return rows


CASES = {"one_op": one_op, "chain": chain, "block": block, "llama": llama}


def main(argv=None) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)   # torch.export's pytree notices
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="one_op,chain,block", help=f"of {','.join(CASES)}")
    ap.add_argument("--devices", default="cpu,webgpu")
    args = ap.parse_args(argv)
    args.devices = args.devices.split(",")
    print(f"{'case':<52} {'value':>10}")
    for name in args.only.split(","):
        for label, value, unit in CASES[name](args):
            print(f"{label:<52} {value:>10.2f} {unit}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

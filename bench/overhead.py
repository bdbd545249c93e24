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
import statistics
import struct
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
    r = b.payload
    calls, scratch = r.calls, executor._scratch_view
    executor._bind_inputs(r, [x])   # as execute patches them in
    executor._bind_outputs(r, None)

    def run():
        for fn, ins, outs, attrs in calls:
            fn(ins, outs, attrs, scratch)
    try:
        return min_us(run, 500)
    finally:
        executor._bind_inputs(r, None)


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
            one = _gpu_us(executor, x, mode="whole", runs=5)
            n = len(executor.plan.binding_for([x]).payload.dispatches)
            rows += [(f"chain {n} dispatches webgpu: wall", wall, "µs"),
                     ("  GPU timestamps sum (a pass each)", gpu, "µs"),
                     ("  GPU timestamps of one pass", one, "µs"),
                     ("  host per dispatch ((wall - GPU one pass) / dispatches)", (wall - one) / n,
                      "µs"),
                     ("  encode + submit only, per dispatch", _encode_us(executor, x) / n, "µs"),
                     ("  host per dispatch ((wall - GPU) / dispatches)", (wall - gpu) / n, "µs"),
                     ("  host (wall - GPU) / budget (6 µs x dispatches + 200 µs)",
                      (wall - gpu) / (6 * n + 200), "x")]
        prog.destroy()
    return rows


def _encode_us(executor, x) -> float:
    """Host µs to encode the binding's dispatches (encoder, pass, set/dispatch calls, finish)
    and submit them: wgpu-native 29 leaks a finished command buffer that is never submitted
    (finishing without a submit read 45 µs a dispatch on an H100 whose execute finished the
    same 5 dispatches in 5.5 µs each)."""
    plan = executor.plan.binding_for([x]).payload.dispatches
    device, queue = executor._gpu.device, executor._gpu.queue

    def encode():
        enc = device.create_command_encoder()
        executor._encode(enc.begin_compute_pass(), plan)
        queue.submit([enc.finish()])
    t = min_us(encode, 50)
    queue.read_buffer(executor._dummy)   # the submitted work drains before the next figure
    return t


def _transfers_us(executor, x, runs: int) -> float:
    """Wall µs of an execute's host-GPU traffic alone, through the executor's own buffers: the
    input upload, the live outputs' copies into the readback buffer in one submit, the map
    wait and the copy out; no dispatch. What the wall spends on moving bytes and on one
    submit-to-map round trip, which no host work of ours can go under."""
    b = executor.plan.binding_for([x])
    device, queue = executor._gpu.device, executor._gpu.queue

    def transfer():
        executor._upload(b, [x])
        enc = device.create_command_encoder()
        executor._encode_copies(enc, b)
        queue.submit([enc.finish()])
        executor._read(b, None)
    return min_us(transfer, runs)


def _gpu_us(executor, x, mode: str = "each", runs: int = 3) -> float:
    """Min over `runs` of the GPU timestamps summed, timed as execute_profiled's `mode` times
    them: "each" (a pass per dispatch, what the issues measured) or "whole" (one pass holding
    them all, as execute encodes)."""
    best = float("inf")
    for _ in range(runs):
        _, times, clock = executor.execute_profiled([x], mode=mode)
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


def llama_layer(small: bool = False, max_seq: int = 2048, passes=None):
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    dim, heads, hidden, kv = (256, 4, 512, 2) if small else (2048, 32, 8192, 8)
    model = seeded(TransformerBlock(dim, heads, hidden, kv_heads=kv))
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    seq = torch.export.Dim("seq", min=1, max=max_seq)
    return lower(model, (torch.randn(1, 16, dim),), dynamic_shapes=({1: seq},),
                 device="webgpu", passes=passes).buffer


def warm_gpu(m, x, seconds: float = 1.5) -> None:
    """Keep the GPU busy until its clocks have risen: an idle H200 runs this layer 5x slower
    (timestamp sums of 27.6 ms at T=512 against 5.0 ms once warm, in one session)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        m.execute([x])


def _dispatch_rows(executor, x, runs: int = 9) -> list:
    """Each dispatch's GPU time in a pass of its own, what it adds to one pass holding the
    dispatches before it (the min of each prefix pass over runs, less the previous one's),
    and what leaving it out saves from the whole pass (the median over runs of each run's
    difference of two passes run back to back): the profile under the sums, and what fusing
    a dispatch away could win at most."""
    own: dict = {}
    prefix: dict = {}
    saved: dict = {}
    for _ in range(runs):
        _, dropped, _ = executor.execute_profiled([x], mode="dropped")
        for i, (_, t) in enumerate(dropped):
            saved.setdefault(i, []).append(t * 1e6)
        _, times, _ = executor.execute_profiled([x])
        for i, (label, t) in enumerate(times):
            own[(i, label)] = min(own.get((i, label), float("inf")), t * 1e6)
        _, added, _ = executor.execute_profiled([x], mode="marginal")
        total = 0.0
        for i, (_, t) in enumerate(added):
            total += t * 1e6
            prefix[i] = min(prefix.get(i, float("inf")), total)
    rows: list = []
    for (i, label), t in own.items():
        rows += [(f"    {i}: {label}, own pass", t, "µs"),
                 (f"    {i}: {label}, adds to one pass", prefix[i] - prefix.get(i - 1, 0.0),
                  "µs"),
                 (f"    {i}: {label}, one pass without it saves", statistics.median(saved[i]),
                  "µs")]
    return rows


def llama(args) -> list:
    prog, m = load(llama_layer(args.small), "webgpu")
    (_, executor), = m.delegates
    warm_gpu(m, torch.randn(1, 512, 256 if args.small else 2048))
    rows = []
    for t in (1, 512):
        x = torch.randn(1, t, 256 if args.small else 2048)
        _, wall = timed(lambda: m.execute([x]), 50 if t == 1 else 10)
        gpu = _gpu_us(executor, x)
        one = _gpu_us(executor, x, mode="whole", runs=5)
        _, again = timed(lambda: m.execute([x]), 50 if t == 1 else 10)   # clocks may move
        wall = min(wall, again)
        executor.encode_ahead, was = not executor.encode_ahead, executor.encode_ahead
        m.execute([x])
        _, other = timed(lambda: m.execute([x]), 50 if t == 1 else 10)
        executor.encode_ahead = was
        unfinished = _unfinished_wall(m, x, 50 if t == 1 else 10)
        other_label = "not encoding ahead (ETWGPU_ENCODE_AHEAD=0)" if was else \
            "encoding ahead (the default)"
        n = len(executor.plan.binding_for([x]).payload.dispatches)
        moved = _transfers_us(executor, x, 50 if t == 1 else 10)
        rows += [(f"llama layer T={t} webgpu: wall", wall * 1e3, "µs"),
                 (f"  GPU timestamps sum ({n} dispatches, a pass each)", gpu, "µs"),
                 ("  GPU timestamps of one pass (as execute encodes)", one, "µs"),
                 ("  wall / GPU sum", wall * 1e3 / gpu, "x"),
                 (f"  wall, {other_label}", other * 1e3, "µs"),
                 ("  that wall / GPU sum", other * 1e3 / gpu, "x"),
                 ("  wall, encoding ahead but not finishing (HELD_BINDINGS=0)", unfinished * 1e3,
                  "µs"),
                 ("  wall / GPU one pass", wall * 1e3 / one, "x"),
                 ("  encode + submit only, per dispatch", _encode_us(executor, x) / n, "µs"),
                 ("  host per execute (wall - GPU sum)", wall * 1e3 - gpu, "µs"),
                 ("  host / budget (6 µs x dispatches + 200 µs)", (wall * 1e3 - gpu) / (6 * n + 200),
                  "x"),
                 ("  host (wall - GPU one pass) / budget", (wall * 1e3 - one) / (6 * n + 200),
                  "x"),
                 (f"  transfers alone ({_kib(x)} KiB in, outputs back, one submit, no "
                  f"dispatch)", moved, "µs"),
                 ("  host less transfers (wall - GPU one pass - transfers)",
                  wall * 1e3 - one - moved, "µs"),
                 ("  that / budget", (wall * 1e3 - one - moved) / (6 * n + 200), "x")]
        rows += _dispatch_rows(executor, x)
    rows += _norm_fusion_rows(args, executor)
    prog.destroy()
    return rows


def _kib(x: torch.Tensor) -> int:
    return x.numel() * x.element_size() // 1024


def _unfinished_wall(m, x, runs: int) -> float:
    """m's wall with its executor encoding ahead but finishing nothing ahead."""
    from delegate.runtime import webgpu_executor

    held, webgpu_executor.HELD_BINDINGS = webgpu_executor.HELD_BINDINGS, 0
    try:
        m.execute([x])   # submits what was held
        _, wall = timed(lambda: m.execute([x]), runs)
    finally:
        webgpu_executor.HELD_BINDINGS = held
    return wall


def _norm_fusion_rows(args, fused, rounds: int = 5) -> list:
    """The T=1 layer's one pass with the norms in their linears' GEMV prologues (all passes,
    `fused`) and as dispatches of their own (rms_norm_linear off), each the min of `rounds`
    alternated with the other in this run: what that fusion saves."""
    from delegate.passes import PASSES

    spec = ",".join(n for n in PASSES if n != "rms_norm_linear")
    prog, m = load(llama_layer(args.small, passes=spec), "webgpu")
    (_, plain), = m.delegates
    x = torch.randn(1, 1, 256 if args.small else 2048)
    best = {"fused": float("inf"), "plain": float("inf")}
    for executor in (fused, plain):   # the GPU idled while this program was lowered
        warm_gpu(executor, x, 1.0)
    for _ in range(rounds):
        for name, executor in (("fused", fused), ("plain", plain)):
            best[name] = min(best[name], _gpu_us(executor, x, mode="whole", runs=3))
    n = {name: len(e.plan.binding_for([x]).payload.dispatches)
         for name, e in (("fused", fused), ("plain", plain))}
    prog.destroy()
    return [(f"llama layer T=1 webgpu, one pass: norms fused ({n['fused']} dispatches)",
             best["fused"], "µs"),
            (f"  norms as dispatches of their own ({n['plain']}, rms_norm_linear off)",
             best["plain"], "µs"),
            ("  fused / unfused", best["fused"] / best["plain"], "x")]


_PARAMS_SHADER = """
struct P {{ n: u32, a: f32, pad0: u32, pad1: u32 }}
{decl}
@group(0) @binding({out_binding}) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {{
    if (g.x < p.n) {{ out[g.x] = p.a; }}
}}
"""


def params(args) -> list:
    """Per-dispatch params for 64 dispatches: one write_buffer of a block of 256-byte-aligned
    uniforms against set_immediates per dispatch (push constants), host µs per execute."""
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if "immediates" not in adapter.features:
        return [("params upload: adapter has no immediates", 0.0, "")]
    dev = adapter.request_device_sync(required_features=["immediates"],
                                      required_limits={"max-immediate-size": 16})
    n, stride = 64, 256
    out = dev.create_buffer(size=4 * 64, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    block = dev.create_buffer(size=n * stride, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
    data = bytearray(n * stride)

    def pipeline(decl, out_binding, layout_entries, immediate):
        bgl = dev.create_bind_group_layout(entries=layout_entries)
        pl = dev.create_pipeline_layout(bind_group_layouts=[bgl], immediate_size=immediate)
        src = _PARAMS_SHADER.format(decl=decl, out_binding=out_binding)
        mod = dev.create_shader_module(code=src)
        return bgl, dev.create_compute_pipeline(layout=pl, compute={"module": mod, "entry_point": "main"})

    storage = {"binding": 1, "visibility": wgpu.ShaderStage.COMPUTE,
               "buffer": {"type": wgpu.BufferBindingType.storage}}
    uniform = {"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE,
               "buffer": {"type": wgpu.BufferBindingType.uniform}}
    bgl_u, pipe_u = pipeline("@group(0) @binding(0) var<uniform> p: P;", 1, [uniform, storage], 0)
    groups = [dev.create_bind_group(layout=bgl_u, entries=[
        {"binding": 0, "resource": {"buffer": block, "offset": i * stride, "size": 16}},
        {"binding": 1, "resource": {"buffer": out, "offset": 0, "size": out.size}}])
        for i in range(n)]
    bgl_i, pipe_i = pipeline("var<immediate> p: P;", 0, [dict(storage, binding=0)], 16)
    group_i = dev.create_bind_group(layout=bgl_i, entries=[
        {"binding": 0, "resource": {"buffer": out, "offset": 0, "size": out.size}}])
    words = [struct.pack("<If8x", 64, float(i)) for i in range(n)]

    def with_block():
        dev.queue.write_buffer(block, 0, data)
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        for g in groups:
            cp.set_pipeline(pipe_u)
            cp.set_bind_group(0, g)
            cp.dispatch_workgroups(1)
        cp.end()
        dev.queue.submit([enc.finish()])
        dev.queue.read_buffer(out, 0, 16)

    def with_immediates():
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        for w in words:
            cp.set_pipeline(pipe_i)
            cp.set_bind_group(0, group_i)
            cp.set_immediates(0, w, 0, 16)
            cp.dispatch_workgroups(1)
        cp.end()
        dev.queue.submit([enc.finish()])
        dev.queue.read_buffer(out, 0, 16)

    a = min_us(with_block, 20)
    b = min_us(with_immediates, 20)
    a = min(a, min_us(with_block, 20))
    return [(f"{n} dispatches + read: one params block write", a, "µs"),
            (f"{n} dispatches + read: set_immediates each", b, "µs"),
            ("  immediates / block", b / a, "x")]


def submit_split(args) -> list:
    """The Llama-shaped layer at T=1 with its dispatches split over 1, 2 or 4 submits."""
    prog, m = load(llama_layer(args.small), "webgpu")
    (_, ex), = m.delegates
    x = torch.randn(1, 1, 256 if args.small else 2048)
    b = ex.plan.binding_for([x])
    gpu = ex._gpu

    def run(parts: int):
        ex._upload(b, [x])
        plan = b.payload.dispatches
        cut = -(-len(plan) // parts)
        chunks = [plan[i:i + cut] for i in range(0, len(plan), cut)]
        for chunk in chunks[:-1]:
            enc = gpu.device.create_command_encoder()
            ex._encode(enc.begin_compute_pass(), chunk)
            gpu.queue.submit([enc.finish()])
        enc = gpu.device.create_command_encoder()
        ex._encode(enc.begin_compute_pass(), chunks[-1])
        return ex._finish(enc, b, None)

    rows = [(f"llama T=1, {k} submit(s)", min_us(lambda: run(k), 20), "µs") for k in (1, 2, 4)]
    rows += [(f"llama T=1, {k} submit(s), again", min_us(lambda: run(k), 20), "µs")
             for k in (1, 2, 4)]
    prog.destroy()
    return rows


def host_profile(args) -> list:
    """cProfile of the Llama-shaped layer's execute at T=1: each function's own time per
    execute, the top 12 (what the wall beyond the GPU is made of)."""
    import cProfile
    import pstats

    prog, m = load(llama_layer(args.small), "webgpu")
    x = torch.randn(1, 1, 256 if args.small else 2048)
    warm_gpu(m, x)
    runs, prof = 300, cProfile.Profile()
    prof.enable()
    for _ in range(runs):
        m.execute([x])
    prof.disable()
    prog.destroy()
    stats = pstats.Stats(prof).stats   # (file, line, name) -> (calls, _, own s, cumulative s, _)
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]
    return [(f"  T=1 own time: {name} ({file.rsplit('/', 1)[-1]}:{line})", own / runs * 1e6,
             "µs/execute") for (file, line, name), (_, _, own, _, _) in top]


def encode_parts(args) -> list:
    """Where the host time of encoding the T=1 layer goes: an empty encoder's create, pass and
    finish; the pass calls of its dispatches; their finish (wgpu records to the driver there);
    a submit of the finished buffer, each timed alone (min of batches)."""
    prog, m = load(llama_layer(args.small), "webgpu")
    (_, ex), = m.delegates
    x = torch.randn(1, 1, 256 if args.small else 2048)
    m.execute([x])
    plan, gpu = ex.plan.binding_for([x]).payload.dispatches, ex._gpu
    device, queue = gpu.device, gpu.queue

    def empty():
        enc = device.create_command_encoder()
        enc.begin_compute_pass().end()
        queue.submit([enc.finish()])   # submitted: a finished buffer never submitted leaks

    def timed_parts(runs: int = 200) -> tuple:
        calls = finish = submit = float("inf")
        for _ in range(runs):
            t0 = time.perf_counter()
            enc = device.create_command_encoder()
            ex._encode(enc.begin_compute_pass(), plan)
            t1 = time.perf_counter()
            cmd = enc.finish()
            t2 = time.perf_counter()
            queue.submit([cmd])
            t3 = time.perf_counter()
            calls, finish, submit = min(calls, t1 - t0), min(finish, t2 - t1), min(submit, t3 - t2)
        queue.read_buffer(ex._dummy)
        return calls * 1e6, finish * 1e6, submit * 1e6

    base = min_us(empty, 50)
    calls, finish, submit = timed_parts()
    prog.destroy()
    n = len(plan)
    return [(f"T=1 encode parts ({n} dispatches): empty encoder + pass + submit", base, "µs"),
            ("  encoder + pass calls", calls, "µs"), ("  finish", finish, "µs"),
            ("  submit", submit, "µs"), ("  per dispatch (calls + finish) / n", (calls + finish) / n,
                                         "µs")]


CASES = {"one_op": one_op, "chain": chain, "block": block, "llama": llama, "params": params,
         "submit_split": submit_split, "host_profile": host_profile,
         "encode_parts": encode_parts}


def main(argv=None) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)   # torch.export's pytree notices
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="one_op,chain,block", help=f"of {','.join(CASES)}")
    ap.add_argument("--devices", default="cpu,webgpu")
    ap.add_argument("--small", action="store_true", help="a small layer, for a smoke run")
    args = ap.parse_args(argv)
    args.devices = args.devices.split(",")
    print(f"{'case':<52} {'value':>10}")
    for name in args.only.split(","):
        for label, value, unit in CASES[name](args):
            print(f"{label:<52} {value:>10.2f} {unit}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

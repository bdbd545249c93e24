"""Per-op CPU fallback inside a WebGPU load: the nodes with no WGSL kernel run on the CPU kernels.

The WebGPU executor splits its dispatch list at each run of such nodes. Reaching a run, it
submits what it has encoded, reads back only the values the run reads that live on the GPU,
calls the CPU kernels on host tensors, and writes the run's results to their GPU buffers, so the
buffers move only at the segment edges. Values are written once (the IR is SSA), so a value
already on the host (read back or produced by an earlier run) is never read back again.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from delegate import ops as registry
from delegate.errors import UnsupportedError
from kernels_cpu.threadpool import single_threaded_torch

@dataclass
class CpuRun:
    """One run of consecutive CPU nodes of one binding, ready to call."""
    steps: list           # graph plan step indices it runs
    calls: list           # [(step index, kernel fn, ins, outs, attrs)]
    inputs: list          # [(graph input position, [(arg list, index)])]
    reads: list           # [(GPU buffer, staging offset, nbytes, host tensor)]
    writes: list          # [(GPU buffer, host tensor)]
    staging_bytes: int


def build_run(ex, steps: list, binding, host: dict) -> CpuRun:
    """Prepare the CPU run of `steps` (graph plan steps) for one binding. `host` maps value id
    -> host tensor and is shared by the binding's runs: what one produced, later ones reuse."""
    graph, kernels = ex.graph, ex._cpu_kernels
    positions = {vid: k for k, vid in enumerate(graph.inputs)}
    reads, inputs, calls, offset = [], {}, [], 0
    for st in steps:
        ins = []
        for j, vid in enumerate(st.inputs):
            if vid == -1:
                ins.append(None)
            elif vid in ex._host_weights:
                ins.append(ex._host_weights[vid])
            elif vid in positions:
                inputs.setdefault(positions[vid], []).append((ins, j))
                ins.append(None)
            else:
                if vid not in host:
                    host[vid] = _host_tensor(graph, vid, binding)
                    size = host[vid].numel() * 4
                    reads.append((ex._buffer_of(vid), offset, size, host[vid]))
                    offset += size
                ins.append(host[vid])
        outs = []
        for k, vid in enumerate(st.outputs):
            # an in-place op (a cache write) updates its input 0's host copy, uploaded whole
            in_place = k == 0 and registry.get_op(st.op).in_place
            host[vid] = ins[0] if in_place else _host_tensor(graph, vid, binding)
            outs.append(host[vid])
        calls.append((st.index, kernels[st.index].fn, ins, outs, binding.attrs[st.index]))
    writes = [(ex._buffer_of(vid), host[vid]) for st in steps for vid in st.outputs]
    return CpuRun([st.index for st in steps], calls, sorted(inputs.items()), reads, writes, offset)


def _host_tensor(graph, vid: int, binding) -> torch.Tensor:
    return torch.empty(binding.live[vid], dtype=graph.values[vid].dtype)


def staging_buffer(ex, runs_bytes: int):
    """The MAP_READ buffer the runs read back through, sized for the largest run's reads."""
    import wgpu

    return ex._new_buffer(runs_bytes, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)


def run(ex, r: CpuRun, encoder, inputs: list, attrs_now: dict):
    """Submit the encoder, read back, run the CPU kernels (offset-dependent ones with this
    execute's attributes, attrs_now), upload; return a fresh encoder."""
    from delegate.runtime.webgpu_executor import _NP_DTYPES, _to_gpu_dtype

    gpu = ex._gpu
    for buf, off, size, _ in r.reads:
        if size:
            encoder.copy_buffer_to_buffer(buf, 0, ex._staging, off, size)
    gpu.queue.submit([encoder.finish()])
    if r.staging_bytes:
        raw = gpu.map_read(ex._staging, r.staging_bytes)
        try:
            for _, off, size, t in r.reads:
                if size:
                    src = np.frombuffer(raw, _NP_DTYPES[t.dtype], size // 4, off).reshape(t.shape)
                    np.copyto(t.numpy(), src != 0 if t.dtype == torch.bool else src,
                              casting="unsafe")
        finally:
            gpu.unmap_read(ex._staging)
    for pos, sites in r.inputs:
        for lst, j in sites:
            lst[j] = inputs[pos]
    with single_threaded_torch():
        for step, fn, ins, outs, attrs in r.calls:
            fn(ins, outs, attrs_now.get(step, attrs), ex._cpu_scratch)
    for buf, t in r.writes:
        if t.numel():
            data = _to_gpu_dtype(t, "CPU fallback result", UnsupportedError).numpy()
            gpu.queue.write_buffer(buf, 0, data)
            ex.transfers.upload(data.nbytes)
    ex.transfers.download(r.staging_bytes)
    return gpu.device.create_command_encoder()

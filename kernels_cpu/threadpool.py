"""The process-wide thread pool every CPU kernel runs on, and the per-load scratch arena.

torch releases the GIL inside its ops, so Python threads that each call torch on a disjoint
slice of work run in parallel. torch's own intra-op threads are held at 1 while our pool runs
(`single_threaded_torch`), otherwise every worker would fan out again and oversubscribe cores.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

from delegate.errors import DelegateError
from delegate.shape_math import numel

_local = threading.local()


def _default_threads() -> int:
    env = os.environ.get("ETWGPU_NUM_THREADS")
    return max(1, int(env)) if env else max(1, os.cpu_count() or 1)


class ThreadPool:
    """A fixed set of workers; the calling thread takes part as worker 0."""

    def __init__(self, num_threads: int):
        self.num_threads = max(1, int(num_threads))
        self._executor = None
        if self.num_threads > 1:
            self._executor = ThreadPoolExecutor(self.num_threads - 1, thread_name_prefix="etwgpu",
                                                initializer=_one_torch_thread)
            self._start_workers()

    def _start_workers(self) -> None:
        """Create every worker now, so each runs _one_torch_thread once, then give the caller
        back its own torch thread count (set_num_threads also writes a process-wide value)."""
        before = torch.get_num_threads()
        barrier = threading.Barrier(self.num_threads - 1)
        for f in [self._executor.submit(barrier.wait) for _ in range(self.num_threads - 1)]:
            f.result()
        torch.set_num_threads(before)

    def run(self, tasks: list[Callable[[int], None]]) -> None:
        """Run tasks[i](i) for every i, at most num_threads at once; re-raises the first error.

        Called from inside a worker, the tasks run inline: nested parallelism would deadlock a
        fixed pool and could only oversubscribe.
        """
        if len(tasks) == 1 or self._executor is None or getattr(_local, "in_pool", False):
            for i, t in enumerate(tasks):
                t(i)
            return
        futures = [self._executor.submit(_in_pool, t, i) for i, t in enumerate(tasks[1:], 1)]
        _in_pool(tasks[0], 0)
        for f in futures:
            f.result()

    def parallel_for(self, n: int, fn: Callable[[int, int, int], None], min_chunk: int = 1):
        """Split range(n) into at most num_threads contiguous chunks; fn(worker, start, stop)."""
        if n <= 0:
            return
        workers = max(1, min(self.num_threads, n // max(1, min_chunk)))
        bounds = [n * w // workers for w in range(workers + 1)]
        self.run([
            (lambda w, a=bounds[w], b=bounds[w + 1]: fn(w, a, b)) for w in range(workers)
        ])

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)


def _one_torch_thread() -> None:
    """A worker's torch ops run on that worker alone. OpenMP keeps the thread count per
    thread, so this holds for the worker's life whatever the caller's count is later."""
    torch.set_num_threads(1)
    # ATen sets a thread's OpenMP count from the process-wide value on the thread's first
    # query; make that happen now, while the value is 1, not after the caller restores it.
    torch.get_num_threads()


def _in_pool(task, i):
    _local.in_pool = True
    try:
        task(i)
    finally:
        _local.in_pool = False


_POOL: ThreadPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool() -> ThreadPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPool(_default_threads())
        return _POOL


def set_num_threads(n: int) -> None:
    """Resize the process-wide pool (benchmarks compare 1 and 2 threads)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None and _POOL.num_threads == n:
            return
        old, _POOL = _POOL, ThreadPool(n)
    if old is not None:
        old.shutdown()


class torch_threads:
    """Let torch's own intra-op threads (OpenMP/MKL) take n cores for one call: a large GEMM
    parallelises better inside BLAS than as row blocks on our pool (1.6x on 2 cores at
    128x512x1536), whose threads would each run a single-threaded BLAS side by side."""

    __slots__ = ("_n", "_before")

    def __init__(self, n: int):
        self._n = n

    def __enter__(self):
        self._before = torch.get_num_threads()
        if self._before != self._n:
            torch.set_num_threads(self._n)
        return self

    def __exit__(self, *exc) -> None:
        if self._before != self._n:
            torch.set_num_threads(self._before)


class single_threaded_torch:
    """Hold torch's intra-op thread count at 1 while our pool does the parallel work.

    A class, not a generator context manager: it brackets every execute, where the
    generator's setup cost showed up in the per-call profile."""

    __slots__ = ("_before",)

    def __enter__(self):
        self._before = torch.get_num_threads()
        if self._before != 1:
            torch.set_num_threads(1)
        return self

    def __exit__(self, *exc) -> None:
        if self._before != 1:
            torch.set_num_threads(self._before)


class ScratchArena:
    """One uint8 buffer carved into disjoint per-worker slices.

    Allocated once (per load, or per call size) and reused, so kernels never allocate scratch
    in their inner loops and no two workers ever share mutable memory.
    """

    def __init__(self, nbytes: int = 0):
        self._buf = torch.empty(max(0, int(nbytes)), dtype=torch.uint8)

    @property
    def nbytes(self) -> int:
        return self._buf.numel()

    def reserve(self, nbytes: int) -> torch.Tensor:
        """Grow (never shrink) to at least nbytes and return the whole buffer."""
        if nbytes > self._buf.numel():
            self._buf = torch.empty(int(nbytes), dtype=torch.uint8)
        return self._buf[:nbytes]

    def adopt(self, buf: torch.Tensor) -> torch.Tensor:
        """Use buf (a uint8 buffer the caller allocated) as the arena; returns it."""
        self._buf = buf
        return buf

    def release(self) -> None:
        self._buf = torch.empty(0, dtype=torch.uint8)


def worker_slices(scratch: torch.Tensor, workers: int, per_worker: int) -> list[torch.Tensor]:
    """Disjoint 64-byte-aligned slices of `per_worker` bytes each."""
    stride = (per_worker + 63) // 64 * 64
    if scratch.numel() < stride * workers:
        raise DelegateError(f"scratch: expected >= {stride * workers} bytes, got {scratch.numel()}")
    return [scratch[w * stride: w * stride + per_worker] for w in range(workers)]


def typed(buf: torch.Tensor, dtype: torch.dtype, shape) -> torch.Tensor:
    """View the front of a uint8 buffer as a contiguous tensor of dtype and shape."""
    nbytes = numel(shape) * dtype.itemsize
    return buf[:nbytes].view(dtype).view(tuple(shape))

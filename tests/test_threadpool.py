"""The shared pool: work is split into disjoint ranges, errors propagate, nesting runs inline,
and torch's intra-op threads are held at 1 while the pool runs."""
import threading

import pytest
import torch

from kernels_cpu import threadpool
from kernels_cpu.threadpool import ScratchArena, ThreadPool, worker_slices
from delegate.errors import DelegateError


def test_parallel_for_covers_the_range_once_in_disjoint_chunks():
    pool = ThreadPool(3)
    seen = []
    lock = threading.Lock()

    def work(w, a, b):
        with lock:
            seen.append((a, b))

    pool.parallel_for(101, work)
    covered = sorted(i for a, b in seen for i in range(a, b))
    assert covered == list(range(101)) and len(seen) == 3
    pool.shutdown()


def test_errors_in_workers_reach_the_caller():
    pool = ThreadPool(2)

    def boom(w, a, b):
        if w == 1:
            raise RuntimeError("worker failed")

    with pytest.raises(RuntimeError, match="worker failed"):
        pool.parallel_for(10, boom)
    pool.shutdown()


def test_nested_parallel_for_runs_inline_instead_of_deadlocking():
    pool = ThreadPool(2)
    hits = []

    def inner(w, a, b):
        hits.append((a, b))

    pool.parallel_for(2, lambda w, a, b: pool.parallel_for(4, inner))
    covered = sorted(i for a, b in hits for i in range(a, b))
    assert covered == [0, 0, 1, 1, 2, 2, 3, 3]
    pool.shutdown()


def test_single_threaded_torch_holds_intra_op_threads_at_one_and_restores():
    before = torch.get_num_threads()
    with threadpool.single_threaded_torch():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_pool_workers_run_torch_single_threaded_and_the_caller_keeps_its_count():
    before = torch.get_num_threads()
    pool = ThreadPool(3)
    counts = {}

    def work(w, a, b):
        counts[w] = torch.get_num_threads()

    pool.parallel_for(3, work)
    pool.shutdown()
    assert torch.get_num_threads() == before
    assert counts[1] == 1 and counts[2] == 1   # worker 0 is the caller itself


def test_worker_slices_are_disjoint_and_bounds_checked():
    arena = ScratchArena(1024)
    buf = arena.reserve(1024)
    a, b = worker_slices(buf, 2, 100)
    a.fill_(1)
    b.fill_(2)
    assert int(a.sum()) == 100 and int(b.sum()) == 200
    with pytest.raises(DelegateError, match="expected >= "):
        worker_slices(buf, 4, 300)

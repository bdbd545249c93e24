"""One loaded Method shared by threads: executes are serialised, so every result equals the
serial run and nothing aborts; separate Methods still run side by side."""
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from delegate.aot import lower
from delegate.models import MLP, seeded
from delegate.runtime.program import Runtime

THREADS, EXECUTES = 4, 200


@pytest.fixture(scope="module")
def mlp_pte():
    batch = torch.export.Dim("batch", min=1, max=16)
    model = seeded(MLP(13, 29, 7))
    return {d: lower(model, (torch.randn(5, 13),), dynamic_shapes=({0: batch},), device=d).buffer
            for d in ("cpu", "webgpu")}


def _inputs(n: int) -> list:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1 + i % 16, 13, generator=g) for i in range(n)]


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_one_method_shared_by_four_threads_matches_the_serial_run(mlp_pte, device):
    prog = Runtime.get().load_program(mlp_pte[device], device=device)
    try:
        m = prog.load_method("forward")
        xs = _inputs(THREADS * EXECUTES)
        serial = [m.execute([x])[0] for x in xs]
        with ThreadPoolExecutor(THREADS) as pool:
            shared = list(pool.map(lambda x: m.execute([x])[0], xs))
        bad = [i for i, (a, b) in enumerate(zip(serial, shared)) if not torch.equal(a, b)]
        assert bad == []
    finally:
        prog.destroy()


def test_separate_methods_run_in_parallel_threads_and_match(mlp_pte):
    progs = [Runtime.get().load_program(mlp_pte["cpu"], device="cpu") for _ in range(THREADS)]
    try:
        methods = [p.load_method("forward") for p in progs]
        xs = _inputs(50)
        want = [methods[0].execute([x])[0] for x in xs]

        def run(m):
            return [m.execute([x])[0] for x in xs]
        with ThreadPoolExecutor(THREADS) as pool:
            for got in pool.map(run, methods):
                assert all(torch.equal(a, b) for a, b in zip(want, got))
    finally:
        for p in progs:
            p.destroy()


def test_execute_racing_destroy_is_typed_not_a_crash(mlp_pte):
    from delegate.errors import ProgramError

    prog = Runtime.get().load_program(mlp_pte["cpu"], device="cpu")
    m = prog.load_method("forward")
    x = torch.randn(3, 13)

    def hammer():
        try:
            for _ in range(200):
                m.execute([x])
        except ProgramError:
            return "stopped"
        return "done"
    with ThreadPoolExecutor(2) as pool:
        f = pool.submit(hammer)
        prog.destroy()
        assert f.result() in ("stopped", "done")

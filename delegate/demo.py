"""The main job: export a small transformer, lower it with our partitioner, write a .pte, run
it through our runner at several sequence lengths, and compare with eager PyTorch."""
from __future__ import annotations

import torch

from delegate.aot import lower
from delegate.models import TinyTransformer, seeded
from delegate.runtime.inspect import describe_outside
from delegate.runtime.program import Runtime
from delegate.timing import timed

MAX_SEQ = 128


def run_demo(out_path: str, device: str = "auto", runs: int = 10) -> None:
    torch.manual_seed(0)
    model = seeded(TinyTransformer(), seed=0)
    tokens = torch.randint(0, 257, (1, 32))
    seq = torch.export.Dim("seq", min=2, max=MAX_SEQ)
    # The blob is portable: partition for the device asked, or for the CPU op set under
    # "auto", and let the runtime choose where it runs.
    part_device = "webgpu" if device == "webgpu" else "cpu"
    pm = lower(model, (tokens,), dynamic_shapes={"tokens": {1: seq}}, device=part_device)
    with open(out_path, "wb") as f:
        f.write(pm.buffer)
    print(f"wrote {out_path}: {len(pm.buffer) / 1024:.1f} KiB")
    print(describe_outside(pm.buffer, "forward"))
    prog = Runtime.get().load_program(out_path, device=device)
    try:
        method = prog.load_method("forward")
        print(f"{'seq':>5} {'max |err|':>11} {'ms/run':>9} {'eager ms':>9}")
        for t in (7, 32, MAX_SEQ):
            x = torch.randint(0, 257, (1, t))
            (got,), ms = timed(lambda: method.execute([x]), runs)
            with torch.no_grad():
                want, eager_ms = timed(lambda: model(x), runs)
            err = (got - want).abs().max().item()
            print(f"{t:>5} {err:>11.3e} {ms:>9.3f} {eager_ms:>9.3f}")
    finally:
        prog.destroy()


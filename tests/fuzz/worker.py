"""One fuzz worker: load the clean program once, then run trials and stream one result line
per trial to stdout, so the parent can attribute a crash or hang to the trial in flight.

    python -m tests.fuzz.worker < job.json      (job: pte path, device, seed, trial numbers)
"""
from __future__ import annotations

import json
import sys
import traceback

import torch

from delegate import blob as blob_codec
from delegate.errors import DelegateError
from delegate.runtime import Runtime
from delegate.runtime.backends import InitContext
from delegate.runtime.program import read_pte
from delegate.runtime.wgpu_backend import WgpuRuntimeBackend

from .mutate import mutate

MARK = "@@FUZZ"
# Trial i fuzzes TARGETS[i % 4]: the whole .pte twice as often as the blob, plain or resealed
# (CRC recomputed, so the mutation reaches the decoder behind the checksum).
TARGETS = ("pte", "blob", "pte", "blob-resealed")
HEADER = 12      # blob header (magic, version, CRC): resealed mutations keep it


class _Tiny(torch.nn.Module):
    """Ops with attributes of most kinds, a weight, a dynamic dim: linear, rms_norm (eps),
    gelu (approximate), add (scalar other, alpha), softmax (dim), clamp (optional bounds)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(6, 8)
        self.norm = torch.nn.RMSNorm(8, eps=1e-5)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.norm(self.fc(x)), approximate="tanh") + 0.5
        return torch.softmax(h.clamp(max=3.0), dim=-1)


def example_input() -> torch.Tensor:
    return torch.randn(3, 6, generator=torch.Generator().manual_seed(1))


def build_pte(device: str) -> bytes:
    from delegate.aot import lower

    dims = {"x": {0: torch.export.Dim("batch", min=1, max=4)}}
    return lower(_Tiny(), (example_input(),), dynamic_shapes=dims, device=device).buffer


def regions(pte: bytes) -> dict:
    """region name -> [(start, end)] of the delegate blobs and named weight data in the .pte."""
    parsed = read_pte(pte)
    out = {"blob": [], "weights": []}
    for d in parsed.program.backend_delegate_data or []:
        out["blob"].append(_span(pte, bytes(d.data)))
    named = parsed.named_data
    for entry in (named.pte_data.values() if named is not None else []):
        buf = named.buffers[entry.buffer_index]
        out["weights"].append(_span(pte, buf if isinstance(buf, bytes) else buf.to_bytes()))
    return out


def _span(pte: bytes, part: bytes) -> tuple:
    at = pte.find(part)
    assert at >= 0 and pte.find(part, at + 1) < 0, "a region must occur once in the .pte"
    return at, at + len(part)


class Trials:
    """The clean program loaded once; each trial mutates it and runs load, load_method and
    execute, classifying the outcome against the clean run's output."""

    def __init__(self, pte: bytes, device: str, seed: int):
        self.pte, self.device, self.seed = pte, device, seed
        self.x = example_input()
        self.clean = Runtime.get().load_program(pte, device=device)
        self.ref = self.clean.load_method("forward").execute([self.x])
        self.regions = regions(pte)
        parsed = read_pte(pte)
        delegate = parsed.program.execution_plan[0].delegates[0]
        self.blob = bytes(parsed.program.backend_delegate_data[0].data)
        self.specs = {cs.key: bytes(cs.value) for cs in delegate.compile_specs or []}

    def run(self, i: int) -> dict:
        target = TARGETS[i % len(TARGETS)]
        seed = f"{self.seed}:{i}"
        if target == "pte":
            data, m = mutate(self.pte, seed)
            where = self._where(m)
        elif target == "blob":
            data, m = mutate(self.blob, seed)
            where = "blob"
        else:
            data, m = mutate(self.blob, seed, lo=HEADER)
            data, where = blob_codec.frame(data[HEADER:]), "blob-resealed"
        result = {"i": i, "target": target, "where": where,
                  "mutation": f"{m.kind} {m.detail} at {m.lo}"}
        try:
            outs = self._execute_pte(data) if target == "pte" else self._execute_blob(data)
        except DelegateError as e:
            return {**result, "outcome": "typed", "error": f"{type(e).__name__}: {e}"[:300]}
        except Exception as e:  # noqa: BLE001 - exactly what the fuzzer is looking for
            tb = traceback.format_exc(limit=-3)
            return {**result, "outcome": "untyped", "error": f"{type(e).__name__}: {e}"[:300],
                    "traceback": tb[-1500:]}
        same = len(outs) == len(self.ref) and all(
            isinstance(o, torch.Tensor) and o.shape == r.shape and torch.equal(o, r)
            for o, r in zip(outs, self.ref))
        return {**result, "outcome": "ok" if same else "ok-but-different"}

    def _where(self, m) -> str:
        for name in ("blob", "weights"):
            if any(m.overlaps(s, e) for s, e in self.regions[name]):
                return f"pte:{name}"
        return "pte:rest"

    def _execute_pte(self, data: bytes) -> list:
        prog = Runtime.get().load_program(data, device=self.device)
        try:
            return prog.load_method("forward").execute([self.x])
        finally:
            prog.destroy()

    def _execute_blob(self, data: bytes) -> list:
        ctx = InitContext(self.specs, self.clean.named_bytes, self.device)
        backend = WgpuRuntimeBackend()
        handle = backend.init(data, ctx)
        try:
            return list(backend.execute(handle, [self.x]))
        finally:
            backend.destroy(handle)


def main() -> None:
    job = json.loads(sys.stdin.read())
    with open(job["pte"], "rb") as f:
        trials = Trials(f.read(), job["device"], job["seed"])
    print(MARK, json.dumps({"ready": True}), flush=True)
    for i in job["trials"]:
        print(MARK, json.dumps({"start": i}), flush=True)
        print(MARK, json.dumps(trials.run(i)), flush=True)


if __name__ == "__main__":
    main()

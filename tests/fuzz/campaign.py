"""Run fuzz trials in worker subprocesses and classify every outcome.

ok: ran and matched the clean run; ok-but-different: ran and did not; typed: a DelegateError;
untyped: any other exception; crash: the worker died during the trial; hang: no result
within the per-trial timeout. A batch of trials shares one worker (the clean program stays
loaded); the worker streams a line per trial, so a crash or hang is charged to the trial in
flight, which is then rerun alone in a fresh worker to tell whether it reproduces by itself.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTCOMES = ("ok", "ok-but-different", "typed", "untyped", "crash", "hang")
WHERE = ("blob", "blob-resealed", "pte:blob", "pte:weights", "pte:rest")
MARK = "@@FUZZ"
READY_TIMEOUT = 300.0      # imports, the WebGPU device and the clean load on a busy machine
TRIAL_TIMEOUT = 30.0


def default_trials() -> int:
    return int(os.environ.get("ETWGPU_FUZZ_TRIALS", "1000"))


def run_campaign(device: str, trials: int, seed: int = 0, batch: int = 500,
                 pte: bytes | None = None) -> list:
    """Results (one dict per trial) of trials 0..trials-1."""
    from .worker import build_pte

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.pte"
        path.write_bytes(pte if pte is not None else build_pte(device))
        results = []
        for start in range(0, trials, batch):
            results += run_batch(str(path), device, seed, list(range(start, min(start + batch, trials))))
        return results


def run_batch(pte: str, device: str, seed: int, todo: list) -> list:
    results = []
    while todo:
        done = _worker(pte, device, seed, todo)
        results += done
        todo = todo[len(done):]
        if done and done[-1]["outcome"] in ("crash", "hang"):
            alone = _worker(pte, device, seed, [done[-1]["i"]])
            done[-1]["alone"] = alone[0]["outcome"] if alone else "no result"
    return results


def _worker(pte: str, device: str, seed: int, trials: list) -> list:
    """Results of the trials this worker finished, the last one a crash or hang if it died."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz.worker"], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    stderr: list = []
    threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True).start()
    proc.stdin.write(json.dumps({"pte": pte, "device": device, "seed": seed, "trials": trials}))
    proc.stdin.close()
    results, current, timeout = [], None, READY_TIMEOUT
    try:
        while True:
            try:
                msg = lines.get(timeout=timeout)
            except queue.Empty:
                proc.kill()
                return results + [_failed(current, trials, "hang", f"no result in {timeout:.0f} s")]
            if msg is None:          # the worker exited
                proc.wait()
                if len(results) == len(trials):
                    return results
                return results + [_failed(current, trials, "crash",
                                          f"exit {proc.returncode}: {''.join(stderr)[-800:]}")]
            timeout = TRIAL_TIMEOUT
            if "start" in msg:
                current = msg["start"]
            elif "outcome" in msg:
                results.append(msg)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _failed(current, trials: list, outcome: str, error: str) -> dict:
    """A crash before the first trial started is a crash of the setup: charged to trial 0."""
    return {"i": current if current is not None else trials[0], "target": "?", "where": "?",
            "mutation": "?", "outcome": outcome, "error": error}


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        if line.startswith(MARK):
            lines.put(json.loads(line[len(MARK):]))
    lines.put(None)


def where_of(i: int, results_by_i: dict) -> str:
    return results_by_i.get(i, {}).get("where", "?")


def summary(results: list) -> dict:
    """where -> Counter of outcomes; a crash or hang takes its trial's target from its seed."""
    from .worker import TARGETS

    table = collections.defaultdict(collections.Counter)
    for r in results:
        where = r["where"] if r["where"] != "?" else TARGETS[r["i"] % len(TARGETS)]
        table[where][r["outcome"]] += 1
    return table


def format_table(device: str, results: list) -> str:
    table = summary(results)
    rows = [f"{'where (' + device + ')':<22}" + "".join(f"{o:>18}" for o in OUTCOMES) + f"{'total':>8}"]
    for where in [w for w in WHERE if w in table] + sorted(set(table) - set(WHERE)):
        c = table[where]
        rows.append(f"{where:<22}" + "".join(f"{c[o]:>18}" for o in OUTCOMES) + f"{sum(c.values()):>8}")
    bad = [r for r in results if r["outcome"] in ("untyped", "crash", "hang", "ok-but-different")]
    for r in bad[:20]:
        rows.append(f"  trial {r['i']} {r['where']} {r['mutation']}: {r['outcome']} "
                    f"{r.get('error', '')[:200]}" + (f" (alone: {r['alone']})" if "alone" in r else ""))
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "webgpu"), default="cpu")
    ap.add_argument("--trials", type=int, default=default_trials())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--trial", type=int, help="rerun one trial (by number) and print its result")
    args = ap.parse_args(argv)
    if args.trial is not None:
        from .worker import build_pte

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "fuzz.pte"
            path.write_bytes(build_pte(args.device))
            print(json.dumps(run_batch(str(path), args.device, args.seed, [args.trial]), indent=1))
        return 0
    results = run_campaign(args.device, args.trials, args.seed, args.batch)
    print(format_table(args.device, results))
    protected_diff = sum(1 for r in results if r["outcome"] == "ok-but-different"
                         and r["where"] in ("blob", "pte:blob", "pte:weights"))
    failures = sum(1 for r in results if r["outcome"] in ("untyped", "crash", "hang"))
    return 1 if failures or protected_diff else 0

"""Runs ExecuTorch's shared operator test suite (executorch/backends/test/suite/operators)
against etwgpu. The test_<op>.py modules here re-export the suite's modules; this file supplies
the `test_runner` fixture they take, parametrized over our flows (see flows.py).

What runs (environment):
  default                   the quick subset (QUICK_MODULES) on DEFAULT_FLOWS; marked `quick`
  ETWGPU_FULL_SUITE=1       every operator module, on FULL_FLOWS
  ETWGPU_SUITE_FLOWS=a,b    these flows instead (ours, or `xnnpack` for the comparison)
  ETWGPU_SUITE_SEED=n       input seed (default 0, so CI runs are reproducible)
  ETWGPU_SUITE_CSV=path     the suite's own per-subtest CSV report
  ETWGPU_SUITE_JSON=path    per-test outcome, delegation and time, for comparing flows

The terminal summary prints per-flow counts: passed (delegated / undelegated), skipped, failed.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

from executorch.backends.test.suite import reporting
from executorch.backends.test.suite.flow import TestFlow
from executorch.backends.test.suite.reporting import TestResult
from executorch.backends.test.suite.runner import UNSUPPORTED_PORTABLE_OPS, run_test

from .flows import FLOWS

# The CI subset the issue names (softmax has no module in the suite; test_softmax.py is ours).
QUICK_MODULES = {"add", "mul", "sub", "div", "linear", "relu", "sigmoid", "softmax", "cat",
                 "permute", "view", "embedding"}
DEFAULT_FLOWS = ("etwgpu_cpu", "etwgpu_portable")
FULL_FLOWS = ("etwgpu_cpu", "etwgpu_portable", "etwgpu_webgpu")


def _full() -> bool:
    return os.environ.get("ETWGPU_FULL_SUITE", "") not in ("", "0")


def _flows() -> list[TestFlow]:
    names = os.environ.get("ETWGPU_SUITE_FLOWS")
    names = names.split(",") if names else (FULL_FLOWS if _full() else DEFAULT_FLOWS)
    return [_flow_named(n.strip()) for n in names if n.strip()]


def _flow_named(name: str) -> TestFlow:
    if name in FLOWS:
        return FLOWS[name]
    if name == "xnnpack":  # for the delegation comparison the issue asks for
        from executorch.backends.test.suite.flows.xnnpack import XNNPACK_TEST_FLOW

        return XNNPACK_TEST_FLOW
    raise pytest.UsageError(f"ETWGPU_SUITE_FLOWS: expected names in "
                            f"{sorted(FLOWS) + ['xnnpack']}, got {name!r}")


class TestRunner:
    """The suite's TestRunner (its conftest imports every backend's flows, so it is not
    imported here), plus: a written reason on every skip, and results kept for the report."""

    __test__ = False

    def __init__(self, flow: TestFlow, test_name: str, test_base_name: str):
        self._flow, self._test_name, self._test_base_name = flow, test_name, test_base_name
        self._subtest = 0
        self._results: list[reporting.TestCaseSummary] = []

    def lower_and_run_model(self, model, inputs, generate_random_test_inputs=True,
                            dynamic_shapes=None):
        summary = run_test(model, inputs, self._flow, self._test_name, self._test_base_name,
                           self._subtest, None, dynamic_shapes=dynamic_shapes,
                           generate_random_test_inputs=generate_random_test_inputs)
        self._subtest += 1
        self._results.append(summary)
        reporting.log_test_summary(summary)
        if summary.result.is_backend_failure():
            raise RuntimeError(f"Test failure: {summary.result.display_name()}") \
                from summary.error
        if not summary.result.is_success():
            pytest.skip(_skip_reason(summary))


def _skip_reason(summary) -> str:
    """The suite skips (not fails) a case for non-backend reasons; say which one."""
    if summary.error is not None:
        return f"suite: eager model or torch.export failed: {type(summary.error).__name__}: " \
               f"{str(summary.error)[:300]}"
    ops = sorted(op for op in summary.undelegated_op_counts or {}
                 if op in UNSUPPORTED_PORTABLE_OPS)
    if ops:
        return f"suite: undelegated ops ExecuTorch's portable kernels lack: {ops}"
    return "suite: graph has a pattern the portable kernels cannot run (3-D convolution)"


@pytest.fixture(params=[pytest.param(f, marks=getattr(pytest.mark, f"flow_{f.name}"))
                        for f in _flows()], ids=str)
def test_runner(request):
    return TestRunner(request.param, request.node.name, request.node.originalname)


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: the backend-suite subset that runs in CI")
    # The re-exported suite modules import the suite's TestFlow dataclass by name.
    config.addinivalue_line("filterwarnings", "ignore:cannot collect test class 'TestFlow'")
    for name in [*FLOWS, "xnnpack"]:
        config.addinivalue_line("markers", f"flow_{name}: backend-suite flow {name}")
    reporting.begin_test_session(os.environ.get("ETWGPU_SUITE_CSV"),
                                 seed=int(os.environ.get("ETWGPU_SUITE_SEED", "0")))
    config.stash[_RESULTS] = {}


def pytest_unconfigure(config):
    if reporting.get_active_test_session() is not None:
        reporting.complete_test_session()


def _module_op(item) -> str:
    return item.path.stem.removeprefix("test_")


def pytest_collection_modifyitems(config, items):
    """Mark the quick subset; without ETWGPU_FULL_SUITE, deselect the rest of the suite;
    apply each flow's written skip/xfail lists (as the suite's conftest does)."""
    here = os.path.dirname(__file__)
    kept, dropped = [], []
    for item in items:
        if not str(item.path).startswith(here):
            kept.append(item)
            continue
        quick = _module_op(item) in QUICK_MODULES
        if quick:
            item.add_marker(pytest.mark.quick)
        (kept if quick or _full() else dropped).append(item)
        callspec = getattr(item, "callspec", None)
        flow = callspec.params.get("test_runner") if callspec else None
        if isinstance(flow, TestFlow):
            name = item.originalname or item.name
            skip, reason = flow.should_skip_test(name, callspec.params)
            if skip:
                item.add_marker(pytest.mark.skip(reason))
            elif flow.should_xfail_test(name):
                item.add_marker(pytest.mark.xfail(reason=f"{flow.name} xfail_patterns",
                                                  strict=True))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# -- per-flow report ------------------------------------------------------------------------
_RESULTS = pytest.StashKey[dict]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    flow = getattr(getattr(item, "callspec", None), "params", {}).get("test_runner")
    if not isinstance(flow, TestFlow):
        return
    rec = item.config.stash[_RESULTS].setdefault(item.nodeid, {
        "flow": flow.name, "test": item.name.split("[")[0] + _param_suffix(item),
        "outcome": "passed", "seconds": 0.0, "delegated": False, "results": []})
    rec["seconds"] += report.duration
    if report.failed:
        rec["outcome"] = "failed"
    elif report.skipped and rec["outcome"] != "failed":
        rec["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        rec["reason"] = str(report.longrepr[2] if isinstance(report.longrepr, tuple)
                            else report.longrepr)[:400]
    if report.when == "call":
        runner = item.funcargs.get("test_runner")
        results = runner._results if isinstance(runner, TestRunner) else []
        rec["results"] = [r.result.name for r in results]
        rec["delegated"] = any(r.result == TestResult.SUCCESS and r.is_delegated()
                               for r in results)


def _param_suffix(item) -> str:
    """The test's own parameters (dtype, ...) without the flow id, to match across flows."""
    params = {k: v for k, v in item.callspec.params.items() if k != "test_runner"}
    return "[" + "-".join(str(v) for v in params.values()) + "]" if params else ""


def pytest_terminal_summary(terminalreporter, config):
    records = config.stash.get(_RESULTS, {})
    if not records:
        return
    table = defaultdict(lambda: defaultdict(float))
    for rec in records.values():
        row = table[rec["flow"]]
        row[rec["outcome"]] += 1
        if rec["outcome"] == "passed":
            row["delegated" if rec["delegated"] else "undelegated"] += 1
        row["seconds"] += rec["seconds"]
    tr = terminalreporter
    tr.write_sep("=", "ExecuTorch backend suite, per flow")
    tr.write_line(f"{'flow':<18}{'passed':>8}{'deleg.':>8}{'undeleg.':>9}{'skipped':>9}"
                  f"{'xfailed':>9}{'failed':>8}{'time s':>9}")
    for flow, row in sorted(table.items()):
        tr.write_line(f"{flow:<18}{row['passed']:>8.0f}{row['delegated']:>8.0f}"
                      f"{row['undelegated']:>9.0f}{row['skipped']:>9.0f}{row['xfailed']:>9.0f}"
                      f"{row['failed']:>8.0f}{row['seconds']:>9.1f}")
    path = os.environ.get("ETWGPU_SUITE_JSON")
    if path:
        with open(path, "w") as f:
            json.dump(list(records.values()), f, indent=1)

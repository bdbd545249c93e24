"""The fuzz campaign: seeded mutations of a tiny model's .pte and delegate blob never crash,
hang or raise an untyped error, and a mutation inside a blob or the named weight data never
runs to a different answer. ETWGPU_FUZZ_TRIALS=100000 runs the long campaign."""
import pytest

from .campaign import default_trials, format_table, run_campaign
from .mutate import mutate

PROTECTED = ("blob", "pte:blob", "pte:weights")


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_fuzz_finds_no_crash_hang_untyped_error_or_silent_corruption(device):
    results = run_campaign(device, default_trials(), seed=0)
    table = format_table(device, results)
    print(table)
    assert len(results) == default_trials()
    bad = [r for r in results if r["outcome"] in ("crash", "hang", "untyped")]
    assert not bad, table
    silent = [r for r in results if r["outcome"] == "ok-but-different" and r["where"] in PROTECTED]
    assert not silent, table


def test_a_mutation_is_a_function_of_its_seed():
    data = bytes(range(256)) * 8
    assert mutate(data, "0:7") == mutate(data, "0:7")
    assert len({mutate(data, f"0:{i}")[0] for i in range(50)}) > 40


def test_every_mutation_kind_occurs_and_reports_its_range():
    data = bytes(1000)
    kinds = {}
    for i in range(200):
        out, m = mutate(data, i)
        kinds[m.kind] = m
        assert 0 <= m.lo <= m.hi <= len(data)
        if m.kind in ("flip", "extreme"):
            assert len(out) == len(data)
        if m.kind == "flip":
            assert out != data
    assert set(kinds) == {"flip", "truncate", "insert", "delete", "extreme"}

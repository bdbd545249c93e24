"""Compare delegation between two flows' ETWGPU_SUITE_JSON reports, test by test.

    python tests/backend_suite/compare_delegation.py ours.json xnnpack.json

Prints how many of the tests the reference flow delegates our flow also delegates, and lists
the rest grouped by operator module.
"""
import json
import sys
from collections import defaultdict


def delegated(path: str) -> dict[str, bool]:
    return {r["test"]: "SUCCESS" in r["results"] for r in json.load(open(path))}


def main(ours_path: str, ref_path: str) -> None:
    ours, ref = delegated(ours_path), delegated(ref_path)
    ref_tests = sorted(t for t, d in ref.items() if d)
    both = [t for t in ref_tests if ours.get(t)]
    print(f"reference delegates {len(ref_tests)} tests; ours delegates {len(both)} of them "
          f"({100 * len(both) / max(len(ref_tests), 1):.1f}%); ours delegates "
          f"{sum(ours.values())} tests in all")
    missing = defaultdict(list)
    for t in ref_tests:
        if not ours.get(t):
            missing[t.split("[")[0].removeprefix("test_").split("_")[0]].append(t)
    for op, tests in sorted(missing.items(), key=lambda kv: -len(kv[1])):
        print(f"  {op:<14}{len(tests):>4}  e.g. {tests[0]}")


if __name__ == "__main__":
    main(*sys.argv[1:3])

"""A deterministic mutation fuzzer over .pte files and delegate blobs (issue 13).

    python -m tests.fuzz --device cpu --trials 1000      # prints the summary table
    ETWGPU_FUZZ_TRIALS=100000 python -m pytest -q tests/fuzz   # the long campaign

mutate.py makes the mutations, worker.py runs trials in a subprocess, campaign.py runs
batches of trials in workers and classifies every outcome.
"""

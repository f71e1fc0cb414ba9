"""Benchmarks: entry points (``run_all.py``, ``e2e/runner.py``, ``kernels/``,
``allreduce_bench.py``) and their harness (``bench.harness``); see ``bench/README.md``."""

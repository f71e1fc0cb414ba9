"""Benchmark harness behind ``nox -s bench`` (``bench/run_all.py``) and the end-to-end
runner (``bench/e2e/runner.py``).

- :mod:`.common`: provenance, capability detection, path scrubbing, markdown helpers;
- :mod:`.schema`: a small dataclass validator for the result files;
- :mod:`.sections`: the sections ``run_all`` runs (cost model, CPU verify microbenchmarks,
  gloo collective counts, GPU kernel scripts, all-reduce microbenchmark, end-to-end);
- :mod:`.collectives`: the rank function of the gloo collective-count section;
- :mod:`.prompts`: MT-Bench / HumanEval / GSM8K prompts from installed packages, offline;
- :mod:`.e2e`: the ``vllm serve`` matrix, load generator, metric scraping and ``compare``;
- :mod:`.readme`: the README section "What to run on 8x PCIe", generated.

Nothing here imports vLLM at module import time.
"""

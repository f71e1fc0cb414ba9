"""Benchmark harness behind ``nox -s bench`` (``bench/run_all.py``) and the end-to-end
runner (``bench/e2e/runner.py``); tests import it as ``bench.harness`` (pytest's
``pythonpath`` in ``pyproject.toml``). It is not part of the installed package.

- :mod:`.suite`: the whole ``run_all`` run: plan, sections, ``results.json``, ``report.md``;
- :mod:`.sections`: one module per section (cost model, CPU verify microbenchmarks, gloo
  collective counts and their rank function, GPU kernel scripts, all-reduce
  microbenchmark, end-to-end);
- :mod:`.e2e`: the ``vllm serve`` matrix, load generator, metric scraping and ``compare``;
- :mod:`.fake_server`: a stand-in for ``vllm serve`` used by the e2e tests;
- :mod:`.common`: provenance, capability detection, path scrubbing, markdown helpers;
- :mod:`.schema`: a small dataclass validator for the result files;
- :mod:`.prompts`: MT-Bench / HumanEval / GSM8K prompts from installed packages, offline;
- :mod:`.readme`: the README section "What to run on 8x PCIe", generated;
- :mod:`.generated_docs`: every generated document and the command that writes it.

Nothing here imports vLLM at module import time.
"""

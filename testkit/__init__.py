"""Test and benchmark helpers; never imported by the product modules (a unit test checks)
and not part of the installed package: import it from the repository root (pytest's
``pythonpath`` has it; the bench entry points put it on ``sys.path``).

- :mod:`.checkpoints`, :mod:`.tokenizers`, :mod:`.tli_scenarios`: tiny Kimi-shaped
  checkpoints and Kimi-format tokenizers written offline;
- :mod:`.vllm_cpu`, :mod:`.cpu_stand_ins`: vLLM's real model classes on a GPU-less build;
- :mod:`.distributed`, :mod:`.tp_scenarios`, :mod:`.draft_scenarios`: gloo tensor-parallel
  runs and what each rank does in them (collective counts);
- :mod:`.verify_equivalence`, :mod:`.verify_simulate`, :mod:`.verify_dist_check`,
  :mod:`.verify_kernel_check`: the verifier's harness (certified token-for-token comparison,
  chi-square, a threaded TP group, a multi-process check, Triton vs torch kernels);
- :mod:`.engine`, :mod:`.engine_ops`, :mod:`.engine_models`, :mod:`.engine_probes`: vLLM's
  whole engine (``LLM.generate``) on CPU in child processes, the op stand-ins it needs, tiny
  Llama targets and drafts, worker-side probes (the ``engine`` test tier);
- :mod:`.upstream_deselect`: the pytest plugin of ``nox -s upstream-tests``;
- :mod:`.interrupt`: a command stopped half-way through a write (SIGKILL / SIGTERM tests).
"""

"""vLLM-aware glue: the code that runs inside a vLLM engine.

* :mod:`.draft_check`: the configuration-time draft checks (the doctor run on a built
  ``VllmConfig``), called by the runtime patch ``runtime/vllm_config.py``;
* :mod:`.draft_agreement`: the opt-in check that every TP rank proposed the same draft
  tokens, called by ``runtime/target_dependent_ar_speculator.py``;
* :mod:`.tli_config` / :mod:`.tli_speculator`: ``method: "kimi_tli"``, registered with
  vLLM's custom-speculator API by the plugin;
* :mod:`.sharded_verify`: sharded verification inside vLLM's sampler and model runner
  (gate, inputs, one sampler object per runner, telemetry around
  :mod:`vllm_kimi_ext.verify`), called by the runtime patches ``runtime/sampler.py`` and
  ``runtime/gpu_model_runner.py``; :mod:`.verifier_choice`: per step, sharded or vLLM's
  batch-sharded sampling, from the thresholds in ``handover.json`` (package data written by
  ``nox -s docs``: serving never builds the cost model).

Together with ``runtime/``, ``plugin.py``, ``compat.py`` (the pin) and the
training capture, these are the only product modules that import vLLM
(``tests/unit/test_package_boundaries.py`` enforces it); the draft tools (``drafts/``),
``checkpoints/`` and the verifier (``verify/``) run without vLLM installed.
"""

"""Vocab-sharded verification inside vLLM 0.34.0's GPU model runner (opt-in).

Enabled by ``VLLM_KIMI_EXT_SHARDED_VERIFY=1`` (with the plugin on). Two runtime patches
(``vllm_kimi_ext/runtime/sampler.py`` and ``gpu_model_runner.py``) call into it:

* ``Sampler.add_request`` remembers each request slot's ``SamplingParams``
  (:func:`.gate.remember_sampling_params`), so a step's plan is decided by
  :func:`~vllm_kimi_ext.verify.protocol.plan_from_params` from the real parameters;
* ``GPUModelRunner.sample`` and ``capture_model`` go to the runner's one
  :class:`.sampler.ShardedSampler` (the only attribute this plugin keeps on vLLM's
  runner), which owns the verifier and its CUDA graphs, the verifier choice, the counters
  and the warm-up.

One module per job:

* :mod:`.gate`: is the step verified over shards (a ``StepPlan``) or by the stock method
  (a ``Fallback`` with its reason)? Fails closed on every vLLM attribute it reads;
* :mod:`.inputs`: the step's device inputs from vLLM's batch (no host read);
* :mod:`.sampler`: :class:`.sampler.ShardedSampler`, one per runner: a step, the warm-up;
* :mod:`.telemetry`: the counters and the periodic log line.

The gate is plain Python over the runner's attributes and is unit-tested on CPU with
stand-in objects; the data flow is tested on CPU with vLLM's batch layout; the GPU path
has not been exercised end to end on a multi-GPU server yet (see the README's feature
table).
"""

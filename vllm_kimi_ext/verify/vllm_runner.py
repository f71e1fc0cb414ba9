"""Vocab-sharded verification inside vLLM 0.34.0's GPU model runner (opt-in).

Enabled by ``VLLM_KIMI_EXT_SHARDED_VERIFY=1`` (with the plugin on). Two runtime
patches (``vllm_kimi_ext/runtime/sampler.py`` and ``gpu_model_runner.py``) call
into this module:

* ``Sampler.add_request`` remembers each request slot's ``SamplingParams``
  (:func:`remember_sampling_params`), so a step's eligibility is decided by
  :func:`~vllm_kimi_ext.verify.plan.plan_verification` from the real parameters
  (top-p, penalties, bad words, logit bias, logprobs, structured output, ... →
  fallback with that reason);
* ``GPUModelRunner.sample`` runs :func:`sample_step`, which takes the sharded
  path for eligible verification steps: ``compute_logits_local`` (patch 0002)
  instead of the logits all-gather,
  :class:`~vllm_kimi_ext.verify.sharded.VocabShardedVerifier` over vLLM's TP group
  (one all-gather of 16 bytes per row per rank for greedy and one-hot drafts),
  then vLLM's own ``get_num_sampled_and_rejected`` and ``SamplerOutput``.
  Everything else — no drafts in the step, TP=1, batch-sharded sampling — runs the
  stock method unchanged; ineligible verification steps run it too and are
  counted per reason (:data:`FALLBACKS`, debug-logged, summarised every 1000).

The eligibility logic (:func:`ineligibility`) is plain Python over the runner's
attributes and is unit-tested on CPU with stand-in objects; the GPU path itself
calls vLLM Triton helpers and has not been exercised end to end on a multi-GPU
server yet (see the README's feature table).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_kimi_ext.verify.plan import Fallback, FallbackCounter, plan_verification

logger = logging.getLogger("vllm_kimi_ext.verify")

#: Fallback reasons counted since start (per process).
FALLBACKS = FallbackCounter(logger)
_PARAMS_ATTR = "_kimi_ext_params"  # on the Sampler: {request slot: SamplingParams}
_VERIFIERS_ATTR = "_kimi_ext_verifiers"  # on the runner: {shard width: verifier}
_state: dict[str, Any] = {"steps": 0}


def remember_sampling_params(sampler: Any, req_idx: int, sampling_params: Any) -> None:
    sampler.__dict__.setdefault(_PARAMS_ATTR, {})[req_idx] = sampling_params


def request_params(sampler: Any, idx_mapping_np) -> list[Any] | None:
    store = getattr(sampler, _PARAMS_ATTR, None)
    if store is None:
        return None
    out = []
    for i in idx_mapping_np.tolist():
        if i not in store:
            return None
        out.append(store[i])
    return out


def ineligibility(runner: Any, input_batch: Any, grammar_output: Any,
                  tp_size: int, vocab_size: int) -> str | None:
    """Why this step cannot be verified over vocab shards; None if it can.

    ``"not_verification"`` and ``"tp1"`` mean the stock path is simply the right
    one (not a fallback); any other value is a counted fallback reason.
    """
    if tp_size <= 1:
        return "tp1"
    if getattr(input_batch, "num_draft_tokens", 0) == 0 or runner.rejection_sampler is None:
        return "not_verification"
    if getattr(runner, "batch_sharder", None) is not None:
        return "batch_sharded_sampling"
    if not hasattr(runner.model, "compute_logits_local"):
        return "no_compute_logits_local"
    if grammar_output is not None:
        return "structured_output"
    rs = runner.rejection_sampler
    if getattr(rs, "use_block_verification", False) or getattr(rs, "fly_window_size", 0) \
            or getattr(rs, "synthetic_conditional_rates", None) is not None:
        return "rejection_method"
    if getattr(rs, "watermark_key", None) is not None:
        return "watermarking"
    if getattr(getattr(runner, "speculator", None), "draft_logits", None) is not None:
        return "probabilistic_draft"
    sampler = runner.sampler
    if sampler.get_logprobs_dims(input_batch.idx_mapping_np) is not None:
        return "logprobs"
    if getattr(sampler, "return_sampling_mask", False):
        return "sampling_mask"
    if getattr(sampler, "compute_nans", False):
        return "nan_metrics"
    if getattr(sampler, "trace_replay_state", None) is not None:
        return "trace_replay"
    params = request_params(sampler, input_batch.idx_mapping_np)
    if params is None:
        return "unknown_sampling_params"
    custom = len(getattr(sampler, "logits_processors", ())) > 3  # beyond bias/penalties/bad
    plan = plan_verification(params, tp_size=tp_size, vocab_size=vocab_size,
                             custom_logits_processors=custom)
    if isinstance(plan, Fallback):
        return plan.reason
    return None


def _bonus_layout_drafts(draft_sampled, cu_num_logits):
    """vLLM's ``draft_sampled[j]`` is the input token at logits row ``j``; the
    draft verified at row ``j`` is the input token of row ``j + 1`` of the same
    request, and each request's last row is its bonus row (draft -1)."""
    import torch

    n = draft_sampled.shape[0]
    nxt = torch.empty_like(draft_sampled)
    nxt[:-1] = draft_sampled[1:]
    nxt[-1:] = -1
    last = (cu_num_logits[1:] - 1).long()
    nxt[last] = -1
    return nxt[:n].long()


def sharded_sample(runner: Any, hidden_states: Any, input_batch: Any, make_verifier: Any):
    """The sharded verification step; returns what ``GPUModelRunner.sample`` returns."""
    import torch
    from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
    from vllm.v1.worker.gpu.sample.output import SamplerOutput
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import gather_draft_sampled

    from vllm_kimi_ext.comm import phase
    from vllm_kimi_ext.verify.batch import VerifyBatch

    sampler = runner.sampler
    states = sampler.sampling_states
    idx = input_batch.idx_mapping
    draft_sampled, pos = gather_draft_sampled(
        input_batch.input_ids, input_batch.positions, input_batch.logits_indices,
        input_batch.expanded_idx_mapping, input_batch.expanded_local_pos,
        sampler.req_states.prefill_len.gpu)
    batch = VerifyBatch(
        cu_num_rows=input_batch.cu_num_logits.long(),
        draft_token_ids=_bonus_layout_drafts(draft_sampled, input_batch.cu_num_logits),
        temperature=states.temperature.gpu[idx].float(),
        seeds=states.seeds.gpu[idx].long(),
        top_k=states.top_k.gpu[idx].long(),
        min_p=states.min_p.gpu[idx].float(),
        positions=pos.long(),
    )
    with phase("verify"):
        local = runner.model.compute_logits_local(hidden_states[input_batch.logits_indices])
        out = make_verifier(local.shape[-1]).verify(local, batch)
    width = runner.rejection_sampler.num_speculative_steps + 1
    sampled = out.sampled
    if sampled.shape[1] < width:
        pad = sampled.new_full((sampled.shape[0], width - sampled.shape[1]), -1)
        sampled = torch.cat([sampled, pad], dim=1)
    num_sampled, num_rejected = get_num_sampled_and_rejected(
        out.num_sampled.to(torch.int32), input_batch.seq_lens, input_batch.cu_num_logits,
        input_batch.idx_mapping, sampler.req_states.prefill_len.gpu)
    so = SamplerOutput(sampled_token_ids=sampled.to(torch.int64), logprobs_tensors=None,
                       num_nans=None, num_sampled=num_sampled, num_rejected=num_rejected,
                       sampling_mask_tensors=None)
    return so, num_sampled, num_rejected


def sample_step(runner: Any, original: Any, hidden_states: Any, input_batch: Any,
                grammar_output: Any):
    """``GPUModelRunner.sample`` with sharded verification: an eligible
    verification step runs :func:`sharded_sample`; any other step runs
    ``original`` (the stock method), an ineligible verification step counted in
    :data:`FALLBACKS` with its reason."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tp_group

    from vllm_kimi_ext.verify.sharded import VocabShardedVerifier, group_coordinator_all_gather

    tp = get_tp_group().world_size
    vocab = runner.model_config.get_vocab_size()
    reason = ineligibility(runner, input_batch, grammar_output, tp, vocab)
    if reason is not None:
        if reason not in ("tp1", "not_verification"):
            FALLBACKS.record(Fallback(reason=reason))
        return original(runner, hidden_states, input_batch, grammar_output)
    cache = runner.__dict__.setdefault(_VERIFIERS_ATTR, {})

    def make_verifier(shard_width: int):
        if shard_width not in cache:  # the lm_head's (padded) vocab shard
            cache[shard_width] = VocabShardedVerifier(
                vocab, tp, get_tensor_model_parallel_rank(),
                group_coordinator_all_gather(get_tp_group()), shard_width=shard_width)
        return cache[shard_width]

    _state["steps"] += 1
    if _state["steps"] % 1000 == 0:
        logger.info("vllm-kimi-ext sharded verification: %d steps, fallbacks %s",
                    _state["steps"], FALLBACKS.as_dict())
    return sharded_sample(runner, hidden_states, input_batch, make_verifier)

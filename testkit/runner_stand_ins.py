"""Stand-ins for the vLLM 0.34.0 objects the sharded-verification gate reads
(:mod:`vllm_kimi_ext.integration.sharded_verify.gate`), without building a model runner.

Each stand-in is a plain namespace whose type carries the ``module.qualname`` of the
vLLM class it stands for, so the gate's exact-type allow-lists
(:data:`~vllm_kimi_ext.integration.sharded_verify.gate.GATE_TYPES`) accept it as that
class, and it carries exactly the attributes
:data:`~vllm_kimi_ext.integration.sharded_verify.gate.GATE_ATTRIBUTES` names (plus what the
sharded path reads), so deleting any one of them is a realistic "upstream renamed it" case.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from vllm_kimi_ext.integration.sharded_verify.gate import remember_sampling_params

_CLASSES: dict[str, type] = {}
_GPU = "vllm.v1.worker.gpu"
LOGIT_BIAS = f"{_GPU}.sample.logit_bias.LogitBiasState"
PENALTIES = f"{_GPU}.sample.penalties.PenaltiesState"
BAD_WORDS = f"{_GPU}.sample.bad_words.BadWordsState"


def stand_in(qualified_name: str, **attrs: Any) -> SimpleNamespace:
    """A namespace whose type is named ``qualified_name`` (``module.Class``)."""
    if qualified_name not in _CLASSES:
        module, _, name = qualified_name.rpartition(".")
        _CLASSES[qualified_name] = type(name, (SimpleNamespace,),
                                        {"__module__": module, "__qualname__": name})
    return _CLASSES[qualified_name](**attrs)


def _uva(values: torch.Tensor) -> SimpleNamespace:
    return SimpleNamespace(gpu=values, np=values.numpy())


def stand_in_runner(params: list[Any], *, vocab: int = 1000, num_steps: int = 3,
                    draft_logits: torch.Tensor | None = None,
                    processors: list[Any] | None = None) -> SimpleNamespace:
    """A GPU model runner whose sampler remembers ``params`` for slots 0..n-1.

    ``draft_logits``: ``[slots, num_steps, V']`` values of a replicated
    ``DraftLogitsCache`` (probabilistic drafts), or None (one-hot drafts).
    """
    n = max(len(params), 1)

    def col(name, default, dtype):
        return _uva(torch.tensor([float(p.get(name, default) if isinstance(p, dict)
                                        else getattr(p, name, default)) for p in params]
                                 or [default], dtype=dtype))

    states = stand_in(f"{_GPU}.sample.states.SamplingStates",
                      temperature=col("temperature", 1.0, torch.float32),
                      seeds=_uva(torch.arange(n, dtype=torch.int64) + 11),
                      top_k=col("top_k", 0, torch.int32), top_p=col("top_p", 1.0, torch.float32),
                      min_p=col("min_p", 0.0, torch.float32))
    sampler = stand_in(
        f"{_GPU}.sample.sampler.Sampler",
        get_logprobs_dims=lambda idx: None, return_sampling_mask=False, compute_nans=False,
        trace_replay_state=None, sampling_states=states,
        req_states=stand_in(f"{_GPU}.states.RequestState",
                            prefill_len=_uva(torch.zeros(n, dtype=torch.int32))),
        logits_processors=list(processors) if processors is not None else [
            stand_in(LOGIT_BIAS), stand_in(PENALTIES), stand_in(BAD_WORDS)])
    for i, p in enumerate(params):
        remember_sampling_params(sampler, i, p)
    cache = None
    if draft_logits is not None:
        cache = stand_in(f"{_GPU}.spec_decode.draft_logits.DraftLogitsCache",
                         values=draft_logits, row_mapping=None)
    return stand_in(
        f"{_GPU}.model_runner.GPUModelRunner",
        rejection_sampler=stand_in(
            f"{_GPU}.spec_decode.rejection_sampler.RejectionSampler",
            use_block_verification=False, fly_window_size=0, synthetic_conditional_rates=None,
            enable_adaptive_verification=False, watermark_key=None,
            num_speculative_steps=num_steps),
        batch_sharder=None, model=SimpleNamespace(compute_logits_local=lambda h: h),
        speculator=stand_in(f"{_GPU}.spec_decode.speculator.BaseSpeculator",
                            draft_logits=cache),
        sampler=sampler, model_config=SimpleNamespace(get_vocab_size=lambda: vocab))


def stand_in_batch(num_reqs: int, num_draft_tokens: int = 3) -> SimpleNamespace:
    return stand_in(f"{_GPU}.input_batch.InputBatch", num_draft_tokens=num_draft_tokens,
                    idx_mapping_np=np.arange(num_reqs))


def owner_of(runner: Any, batch: Any, owner: str) -> Any:
    """The object the gate calls ``owner`` (see ``GATE_ATTRIBUTES``)."""
    return {
        "input_batch": batch,
        "runner": runner,
        "rejection_sampler": runner.rejection_sampler,
        "sampler": runner.sampler,
        "sampling_states": runner.sampler.sampling_states,
        "req_states": runner.sampler.req_states,
        "speculator": runner.speculator,
        "draft_logits": runner.speculator.draft_logits,
    }[owner]


def vllm_layout_batch(drafts: torch.Tensor, first_position: int = 100) -> SimpleNamespace:
    """An ``InputBatch`` stand-in for ``drafts [num_reqs, k]`` in vLLM's layout: request
    ``i`` (slot ``i``) owns logits rows ``i*(k+1) .. i*(k+1)+k``; the input token of
    each row is the previous token (the draft verified at row ``j`` is row ``j+1``'s)."""
    n, k = drafts.shape
    rows = n * (k + 1)
    input_ids = torch.full((rows,), 7, dtype=torch.int64)  # 7: the last accepted token
    for r in range(n):
        input_ids[r * (k + 1) + 1:(r + 1) * (k + 1)] = drafts[r]
    slots = torch.arange(n)
    return stand_in(
        f"{_GPU}.input_batch.InputBatch", num_draft_tokens=n * k,
        idx_mapping_np=slots.numpy(), idx_mapping=slots, input_ids=input_ids,
        positions=torch.arange(rows) + first_position, logits_indices=torch.arange(rows),
        expanded_idx_mapping=torch.repeat_interleave(slots, k + 1),
        expanded_local_pos=torch.arange(k + 1).repeat(n),
        cu_num_logits=torch.arange(n + 1, dtype=torch.int32) * (k + 1), seq_lens=None)


def gather_draft_sampled(input_ids, positions, logits_indices, *_):
    """Torch equivalent of vLLM's Triton ``gather_draft_sampled`` (no prefill placeholders)."""
    return input_ids[logits_indices], positions[logits_indices]


def get_num_sampled_and_rejected(num_sampled, seq_lens, cu_num_logits, idx_mapping, prefill_len):
    """Torch equivalent of vLLM's Triton helper for decode-only steps."""
    rows = (cu_num_logits[1:] - cu_num_logits[:-1]).to(num_sampled.dtype)
    return num_sampled, rows - num_sampled


#: (module, attribute) -> torch replacement, for running the runner path on CPU.
TORCH_HELPERS = {
    (f"{_GPU}.spec_decode.rejection_sampler", "gather_draft_sampled"): gather_draft_sampled,
    (f"{_GPU}.input_batch", "get_num_sampled_and_rejected"): get_num_sampled_and_rejected,
}

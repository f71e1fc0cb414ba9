"""The gate of sharded verification: is this step verified over vocabulary shards
(:class:`~vllm_kimi_ext.verify.protocol.StepPlan`) or by vLLM's stock method
(:class:`~vllm_kimi_ext.verify.protocol.Fallback` with its reason)?

Plain Python over vLLM's runner objects, no state: the runner's
:class:`~.sampler.ShardedSampler` calls :func:`gate` once per step and counts its answer.

It fails closed: it reads exactly the vLLM attributes listed in :data:`GATE_ATTRIBUTES` (a
missing one → ``unknown_vllm_state``, the attribute named in the fallback's detail) and
accepts only the object types in :data:`GATE_TYPES` (an unknown logits processor →
``logits_processors``); a canary test checks both lists against vLLM 0.34.0. Refused by
name: ``block_verification`` (vLLM's block method decides on joint prefix ratios the
sharded verifier does not compute), ``lossy_rejection_method`` (synthetic acceptance rates,
FLy deferred rejection: not lossless by design), ``adaptive_verification``,
``watermarking`` and a draft vocabulary smaller than the target's. With vLLM's
``--enable-batch-sharded-sampling`` on as well, a step the gate would verify over shards
goes to batch-sharded sampling where that is priced faster
(:mod:`~vllm_kimi_ext.integration.verifier_choice`: large top-p batches), answered
:data:`HANDED_OVER` and counted as handed over, not as a fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_kimi_ext.integration.verifier_choice import VerifierChoices
from vllm_kimi_ext.verify.protocol import Fallback, StepPlan, plan_from_params

#: On vLLM's Sampler: {request slot: SamplingParams} (``Sampler.add_request``'s patch).
PARAMS_ATTR = "_kimi_ext_params"


def remember_sampling_params(sampler: Any, req_idx: int, sampling_params: Any) -> None:
    sampler.__dict__.setdefault(PARAMS_ATTR, {})[req_idx] = sampling_params


def request_params(sampler: Any, idx_mapping_np) -> list[Any] | None:
    store = getattr(sampler, PARAMS_ATTR, None)
    if store is None:
        return None
    out = []
    for i in idx_mapping_np.tolist():
        if i not in store:
            return None
        out.append(store[i])
    return out


class UnknownVllmState(Exception):
    """A vLLM attribute the gate reads is missing (an upstream rename or removal)."""

    def __init__(self, owner: str, name: str):
        super().__init__(f"{owner}.{name}")
        self.owner, self.name = owner, name


@dataclass(frozen=True)
class GateAttribute:
    """One vLLM attribute :func:`gate` reads: ``owner`` is the object it is
    read from (as the gate names it), ``vllm_class`` the 0.34.0 class that defines it."""

    owner: str
    name: str
    vllm_class: str


_GPU = "vllm.v1.worker.gpu"
_RUNNER = f"{_GPU}.model_runner.GPUModelRunner"
_BATCH = f"{_GPU}.input_batch.InputBatch"
_RS = f"{_GPU}.spec_decode.rejection_sampler.RejectionSampler"
_SAMPLER = f"{_GPU}.sample.sampler.Sampler"
_STATES = f"{_GPU}.sample.states.SamplingStates"
_SPEC = f"{_GPU}.spec_decode.speculator.BaseSpeculator"
_DRAFT = f"{_GPU}.spec_decode.draft_logits.DraftLogitsCache"
_REQ = f"{_GPU}.states.RequestState"

#: Every vLLM attribute the gate reads, and so every attribute the sharded path
#: (:meth:`.sampler.ShardedSampler.sharded_sample`) then relies on. Read without a
#: default: a missing one makes the step ineligible (``unknown_vllm_state``, counted,
#: logged once per attribute). ``tests/canary/test_sharded_verify_gate.py`` checks each
#: exists on vLLM 0.34.0's real class.
GATE_ATTRIBUTES: tuple[GateAttribute, ...] = tuple(GateAttribute(o, n, c) for o, n, c in (
    ("input_batch", "num_draft_tokens", _BATCH),
    ("input_batch", "idx_mapping_np", _BATCH),
    ("runner", "rejection_sampler", _RUNNER),
    ("runner", "batch_sharder", _RUNNER),
    ("runner", "model", _RUNNER),
    ("runner", "sampler", _RUNNER),
    ("runner", "speculator", _RUNNER),
    ("rejection_sampler", "use_block_verification", _RS),
    ("rejection_sampler", "synthetic_conditional_rates", _RS),
    ("rejection_sampler", "fly_window_size", _RS),
    ("rejection_sampler", "enable_adaptive_verification", _RS),
    ("rejection_sampler", "watermark_key", _RS),
    ("rejection_sampler", "num_speculative_steps", _RS),
    ("sampler", "get_logprobs_dims", _SAMPLER),
    ("sampler", "return_sampling_mask", _SAMPLER),
    ("sampler", "compute_nans", _SAMPLER),
    ("sampler", "trace_replay_state", _SAMPLER),
    ("sampler", "logits_processors", _SAMPLER),
    ("sampler", "sampling_states", _SAMPLER),
    ("sampler", "req_states", _SAMPLER),
    ("sampling_states", "temperature", _STATES),
    ("sampling_states", "seeds", _STATES),
    ("sampling_states", "top_k", _STATES),
    ("sampling_states", "top_p", _STATES),
    ("sampling_states", "min_p", _STATES),
    ("req_states", "prefill_len", _REQ),
    ("speculator", "draft_logits", _SPEC),
    ("draft_logits", "values", _DRAFT),
    ("draft_logits", "row_mapping", _DRAFT),
))
_DECLARED = {(a.owner, a.name) for a in GATE_ATTRIBUTES}
#: ``InputBatch`` fields the sharded path reads once the gate let a step through
#: (checked by the same canary).
SHARDED_PATH_INPUT_BATCH_FIELDS = (
    "input_ids", "positions", "logits_indices", "expanded_idx_mapping",
    "expanded_local_pos", "cu_num_logits", "idx_mapping", "seq_lens",
)

#: Types the gate accepts, by ``module.qualname`` (exact type, not subclasses): any
#: other object in these places makes the step ineligible with the named reason.
SAMPLER_TYPES = (_SAMPLER,)  # GPUWatermarkSampler and model-state samplers: not these
REJECTION_SAMPLER_TYPES = (_RS,)
DRAFT_LOGITS_TYPES = (_DRAFT,)
#: vLLM 0.34.0's built-in logits processors (``Sampler.__init__``). Each acts only on
#: requests whose own parameters ask for it (logit bias / allowed ids / min tokens,
#: penalties, bad words), and :func:`~vllm_kimi_ext.verify.protocol.plan_from_params`
#: refuses those requests;
#: any other processor type (``--logits-processors``, plugins) makes the step fall
#: back with reason ``logits_processors``.
SAFE_LOGITS_PROCESSOR_TYPES = (
    f"{_GPU}.sample.logit_bias.LogitBiasState",
    f"{_GPU}.sample.penalties.PenaltiesState",
    f"{_GPU}.sample.bad_words.BadWordsState",
)
GATE_TYPES: dict[str, tuple[str, ...]] = {
    "sampler": SAMPLER_TYPES,
    "rejection_sampler": REJECTION_SAMPLER_TYPES,
    "draft_logits": DRAFT_LOGITS_TYPES,
    "logits_processors": SAFE_LOGITS_PROCESSOR_TYPES,
}


def type_name(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _read(obj: Any, owner: str, name: str) -> Any:
    if (owner, name) not in _DECLARED:
        raise KeyError(f"the gate reads {owner}.{name}, which GATE_ATTRIBUTES does not name")
    try:
        return getattr(obj, name)
    except AttributeError:
        raise UnknownVllmState(owner, name) from None


#: The gate's answer for a step batch-sharded sampling verifies faster (both on).
HANDED_OVER = "batch_sharded_faster"
#: Gate answers that mean the stock path is simply the right one (not a fallback).
NOT_FALLBACKS = ("tp1", "not_verification", HANDED_OVER)
#: The gate's answer when a vLLM attribute it reads is missing (detail: ``owner.name``).
UNKNOWN_VLLM_STATE = "unknown_vllm_state"


def gate(runner: Any, input_batch: Any, grammar_output: Any, tp_size: int, vocab_size: int,
         choices: VerifierChoices | None = None) -> StepPlan | Fallback:
    """The step's :class:`StepPlan`, or the :class:`Fallback` that runs the stock method.

    Reasons in :data:`NOT_FALLBACKS` mean the stock path is simply the right one; any
    other reason is a counted fallback. Fails closed: a vLLM attribute in
    :data:`GATE_ATTRIBUTES` that is missing gives :data:`UNKNOWN_VLLM_STATE` with the
    attribute as its detail. ``choices``: the runner's per-k verifier choices (with vLLM's
    batch sharder on; a fresh one if not given).
    """
    if tp_size <= 1:
        return Fallback("tp1")
    try:
        return _gate(runner, input_batch, grammar_output, tp_size, vocab_size,
                     choices if choices is not None else VerifierChoices())
    except UnknownVllmState as e:
        return Fallback(UNKNOWN_VLLM_STATE, detail=f"{e.owner}.{e.name}")


def ineligibility(runner: Any, input_batch: Any, grammar_output: Any,
                  tp_size: int, vocab_size: int) -> str | None:
    """Why this step cannot be verified over vocab shards (:func:`gate`'s reason); None if
    it can."""
    d = gate(runner, input_batch, grammar_output, tp_size, vocab_size)
    return d.reason if isinstance(d, Fallback) else None


def _gate(runner, input_batch, grammar_output, tp_size, vocab_size,
          choices: VerifierChoices) -> StepPlan | Fallback:
    reason = _runner_reason(runner, input_batch, grammar_output, vocab_size)
    if reason is not None:
        return Fallback(reason)
    sampler = runner.sampler
    idx_np = input_batch.idx_mapping_np
    params = request_params(sampler, idx_np)
    if params is None:
        return Fallback("unknown_sampling_params")
    custom = any(type_name(p) not in SAFE_LOGITS_PROCESSOR_TYPES
                 for p in _read(sampler, "sampler", "logits_processors"))
    k = _read(runner.rejection_sampler, "rejection_sampler", "num_speculative_steps")
    plan = plan_from_params(
        params, tp_size=tp_size, vocab_size=vocab_size,
        num_rows=int(input_batch.num_draft_tokens) + len(params), max_rows_per_req=k + 1,
        probabilistic=probabilistic_draft(runner), custom_logits_processors=custom)
    if (isinstance(plan, StepPlan) and _read(runner, "runner", "batch_sharder") is not None
            and choices.for_k(k).batch_sharded(plan, params)):
        return Fallback(HANDED_OVER, detail=f"{plan.num_reqs} requests")
    return plan


def _runner_reason(runner, input_batch, grammar_output, vocab_size) -> str | None:
    """The runner-state reasons (everything but the requests' own parameters)."""
    rs = _read(runner, "runner", "rejection_sampler")
    if _read(input_batch, "input_batch", "num_draft_tokens") == 0 or rs is None:
        return "not_verification"
    if not hasattr(_read(runner, "runner", "model"), "compute_logits_local"):
        return "no_compute_logits_local"
    if grammar_output is not None:
        return "structured_output"
    if type_name(rs) not in REJECTION_SAMPLER_TYPES:
        return "rejection_sampler_type"
    if _read(rs, "rejection_sampler", "use_block_verification"):
        return "block_verification"
    if (_read(rs, "rejection_sampler", "synthetic_conditional_rates") is not None
            or _read(rs, "rejection_sampler", "fly_window_size")):
        return "lossy_rejection_method"
    if _read(rs, "rejection_sampler", "enable_adaptive_verification"):
        return "adaptive_verification"
    if _read(rs, "rejection_sampler", "watermark_key") is not None:
        return "watermarking"
    _read(rs, "rejection_sampler", "num_speculative_steps")
    sampler = _read(runner, "runner", "sampler")
    if type_name(sampler) not in SAMPLER_TYPES:
        return "sampler_type"
    reason = _draft_logits_ineligibility(_read(runner, "runner", "speculator"), vocab_size)
    if reason is not None:
        return reason
    idx_np = _read(input_batch, "input_batch", "idx_mapping_np")
    if _read(sampler, "sampler", "get_logprobs_dims")(idx_np) is not None:
        return "logprobs"
    if _read(sampler, "sampler", "return_sampling_mask"):
        return "sampling_mask"
    if _read(sampler, "sampler", "compute_nans"):
        return "nan_metrics"
    if _read(sampler, "sampler", "trace_replay_state") is not None:
        return "trace_replay"
    states = _read(sampler, "sampler", "sampling_states")
    for name in ("temperature", "seeds", "top_k", "top_p", "min_p"):
        _read(states, "sampling_states", name)
    _read(_read(sampler, "sampler", "req_states"), "req_states", "prefill_len")
    return None


def _draft_logits_ineligibility(speculator: Any, vocab_size: int) -> str | None:
    """Probabilistic drafts: vLLM's cache must be the replicated ``[reqs, steps, V']``
    kind, ``V' >= V`` (vLLM verifies over ``min(V, V')`` columns; a smaller draft
    vocabulary would also cut the target's)."""
    cache = _read(speculator, "speculator", "draft_logits")
    if cache is None:
        return None
    if type_name(cache) not in DRAFT_LOGITS_TYPES:
        return "draft_logits_type"
    if _read(cache, "draft_logits", "row_mapping") is not None:
        return "sharded_draft_logits"
    values = _read(cache, "draft_logits", "values")
    if values.dim() != 3:
        return "draft_logits_type"
    if values.shape[-1] < vocab_size:
        return "draft_vocab_smaller"
    return None


def probabilistic_draft(runner: Any) -> bool:
    """vLLM verifies against cached draft logits (``draft_sample_method="probabilistic"``)."""
    return runner.speculator.draft_logits is not None

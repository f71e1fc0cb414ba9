"""Vocab-sharded verification inside vLLM 0.34.0's GPU model runner (opt-in).

Enabled by ``VLLM_KIMI_EXT_SHARDED_VERIFY=1`` (with the plugin on). Two runtime
patches (``vllm_kimi_ext/runtime/sampler.py`` and ``gpu_model_runner.py``) call
into this module:

* ``Sampler.add_request`` remembers each request slot's ``SamplingParams``
  (:func:`remember_sampling_params`), so a step's plan is decided by
  :func:`~vllm_kimi_ext.verify.protocol.plan_from_params` from the real parameters
  (top-p, penalties, bad words, logit bias, logprobs, structured output, ... →
  fallback with that reason);
* ``GPUModelRunner.sample`` runs :func:`sample_step`: the gate (:func:`gate`) returns
  the step's :class:`~vllm_kimi_ext.verify.protocol.StepPlan` or a
  :class:`~vllm_kimi_ext.verify.protocol.Fallback`; a planned step takes
  ``compute_logits_local`` (git patch logits-local) instead of the logits all-gather and runs
  :class:`~vllm_kimi_ext.verify.graph_step.GraphVerifyStep` over vLLM's TP group
  (replayed from CUDA graphs captured at warm-up, :class:`.StepGraphs`), then vLLM's
  own ``get_num_sampled_and_rejected`` and ``SamplerOutput``. Everything else — no
  drafts in the step, TP=1 — runs the stock method unchanged; ineligible
  verification steps run it too and are counted per reason (:data:`FALLBACKS`,
  debug-logged, summarised every 1000 steps).

The gate fails closed: it reads exactly the vLLM attributes
listed in :data:`GATE_ATTRIBUTES` (a missing one → ``unknown_vllm_state``) and
accepts only the object types in :data:`GATE_TYPES` (an unknown logits processor →
``logits_processors``); a canary test checks both lists against vLLM 0.34.0. Refused
by name: ``block_verification`` (vLLM's block method decides on joint prefix ratios
the sharded verifier does not compute), ``lossy_rejection_method`` (synthetic
acceptance rates, FLy deferred rejection: not lossless by design),
``adaptive_verification``, ``watermarking`` and a draft vocabulary smaller than the
target's. With vLLM's ``--enable-batch-sharded-sampling`` on as well, a step the gate
would verify over shards goes to batch-sharded sampling where that is priced faster
(:mod:`~vllm_kimi_ext.integration.verifier_choice`: large top-p batches), answered
``batch_sharded_faster`` and counted as handed over, not as a fallback.

The gate is plain Python over the runner's attributes and is unit-tested on CPU with
stand-in objects; the data flow is tested on CPU with vLLM's batch layout; the GPU
path has not been exercised end to end on a multi-GPU server yet (see the README's
feature table).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from vllm_kimi_ext.integration.verifier_choice import VerifierChoice
from vllm_kimi_ext.verify.protocol import Fallback, FallbackCounter, StepPlan, plan_from_params

logger = logging.getLogger("vllm_kimi_ext.verify")

#: Fallback reasons counted since start (per process).
FALLBACKS = FallbackCounter(logger)
_PARAMS_ATTR = "_kimi_ext_params"  # on the Sampler: {request slot: SamplingParams}
_VERIFIERS_ATTR = "_kimi_ext_verifiers"  # on the runner: {shard width: verifier}
_CHOICE_ATTR = "_kimi_ext_verifier_choice"  # on the runner: {k: VerifierChoice}
_state: dict[str, Any] = {"steps": 0, "handed": 0}


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


class UnknownVllmState(Exception):
    """A vLLM attribute the gate reads is missing (an upstream rename or removal)."""

    def __init__(self, owner: str, name: str):
        super().__init__(f"{owner}.{name}")
        self.owner, self.name = owner, name


@dataclass(frozen=True)
class GateAttribute:
    """One vLLM attribute :func:`ineligibility` reads: ``owner`` is the object it is
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
#: (:func:`sharded_sample`) then relies on. Read without a default: a missing one
#: makes the step ineligible (``unknown_vllm_state``, counted, logged once per
#: attribute). ``tests/canary/test_sharded_verify_gate.py`` checks each exists on
#: vLLM 0.34.0's real class.
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
#: ``InputBatch`` fields :func:`sharded_sample` reads once the gate let a step through
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
_logged_unknown: set[tuple[str, str]] = set()


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


def gate(runner: Any, input_batch: Any, grammar_output: Any, tp_size: int,
         vocab_size: int) -> StepPlan | Fallback:
    """The step's :class:`StepPlan`, or the :class:`Fallback` that runs the stock method.

    Reasons in :data:`NOT_FALLBACKS` mean the stock path is simply the right one; any
    other reason is a counted fallback. Fails closed: a vLLM attribute in
    :data:`GATE_ATTRIBUTES` that is missing gives ``"unknown_vllm_state"`` (logged once
    per attribute).
    """
    if tp_size <= 1:
        return Fallback("tp1")
    try:
        return _gate(runner, input_batch, grammar_output, tp_size, vocab_size)
    except UnknownVllmState as e:
        key = (e.owner, e.name)
        if key not in _logged_unknown:
            _logged_unknown.add(key)
            logger.warning("vllm-kimi-ext sharded verification: vLLM has no %s.%s; every "
                           "such step falls back to the full logits gather "
                           "(reason unknown_vllm_state)", e.owner, e.name)
        return Fallback("unknown_vllm_state")


def ineligibility(runner: Any, input_batch: Any, grammar_output: Any,
                  tp_size: int, vocab_size: int) -> str | None:
    """Why this step cannot be verified over vocab shards (:func:`gate`'s reason); None if
    it can."""
    d = gate(runner, input_batch, grammar_output, tp_size, vocab_size)
    return d.reason if isinstance(d, Fallback) else None


def _gate(runner, input_batch, grammar_output, tp_size, vocab_size) -> StepPlan | Fallback:
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
    if isinstance(plan, StepPlan) and _read(runner, "runner", "batch_sharder") is not None \
            and verifier_choice(runner, k).batch_sharded(plan, params):
        return Fallback(HANDED_OVER, detail=f"{plan.num_reqs} requests")
    return plan


def verifier_choice(runner: Any, k: int) -> VerifierChoice:
    """The runner's :class:`VerifierChoice` for ``k`` drafts per step (made once, logged
    once; ``VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF`` is read then)."""
    from vllm_kimi_ext import envs

    cache = runner.__dict__.setdefault(_CHOICE_ATTR, {})
    if k not in cache:
        cache[k] = VerifierChoice.from_setting(envs.SHARDED_VERIFY_HANDOFF.get(), k)
        logger.info("vllm-kimi-ext sharded verification with --enable-batch-sharded-sampling: "
                    "steps go to batch-sharded sampling per sampling mode, %s",
                    cache[k].describe())
    return cache[k]


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
    if _read(rs, "rejection_sampler", "synthetic_conditional_rates") is not None \
            or _read(rs, "rejection_sampler", "fly_window_size"):
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


def draft_probs_shard(values, expanded_idx_mapping, expanded_local_pos, temperature_rows,
                      vocab_size: int, col_offset: int, shard_width: int):
    """This rank's columns of the draft distribution ``q`` per logits row, as vLLM's
    rejection sampler defines it: ``softmax(draft_logits[req, step, :V] / T)`` with the
    pre-temperature cache row of the request state and draft step of each row
    (``rejection_sample`` divides the cached logits by the request temperature and
    normalises over ``min(V, V')`` columns; no top-k/top-p/min-p on ``q``).

    Every rank holds the replicated cache, so the full normaliser is local (no
    collective). Bonus rows (no draft) get the last step's row (never used); greedy
    rows use T = 1 (their ``q`` is never used either). Columns past ``V`` are 0.
    """
    import torch

    steps = values.shape[1]
    step = expanded_local_pos.long().clamp(max=steps - 1)
    z = values[expanded_idx_mapping.long(), step, :vocab_size].float()
    t = torch.where(temperature_rows > 0, temperature_rows, torch.ones_like(temperature_rows))
    q = torch.softmax(z / t[:, None], dim=-1)
    out = q.new_zeros(q.shape[0], shard_width)
    hi = min(col_offset + shard_width, vocab_size)
    if hi > col_offset:
        out[:, :hi - col_offset] = q[:, col_offset:hi]
    return out


def _count_on_device(out) -> None:
    """Rows that needed the escalation round and requests stopped at a deferred row,
    accumulated on the device (no host read per step; :func:`device_counts` reads them)."""
    acc = _state.get("device")
    if acc is None or acc.device != out.uncertified.device:
        import torch

        acc = _state["device"] = torch.zeros(2, dtype=torch.int64, device=out.uncertified.device)
    acc[0] += out.uncertified.sum()
    acc[1] += out.stopped.sum()


def device_counts() -> dict[str, int]:
    """``{"escalated_rows": n, "deferred_requests": n}`` since start (one host read)."""
    acc = _state.get("device")
    if acc is None:
        return {"escalated_rows": 0, "deferred_requests": 0}
    a, b = acc.tolist()
    return {"escalated_rows": a, "deferred_requests": b}


def draft_probs_full(values, expanded_idx_mapping, expanded_local_pos, temperature_rows,
                     vocab_size: int):
    """The draft distribution ``q`` per logits row over the whole vocabulary, as vLLM's
    rejection sampler defines it (see :func:`draft_probs_shard`); every rank holds the
    replicated cache, so this needs no collective."""
    import torch

    steps = values.shape[1]
    step = expanded_local_pos.long().clamp(max=steps - 1)
    z = values[expanded_idx_mapping.long(), step, :vocab_size].float()
    t = torch.where(temperature_rows > 0, temperature_rows, torch.ones_like(temperature_rows))
    return torch.softmax(z / t[:, None], dim=-1)


def sharded_sample(runner: Any, hidden_states: Any, input_batch: Any, make_verifier: Any,
                   plan: StepPlan | None = None):
    """The sharded verification step; returns what ``GPUModelRunner.sample`` returns.

    Per-request temperature, seed, top-k, top-p and min-p come from vLLM's
    ``SamplingStates`` (the tensors vLLM's own rejection sampler reads); the step's
    shapes and rounds from the requests' ``SamplingParams`` (host objects), so nothing
    here reads the device. ``make_verifier(shard_width)`` returns a callable
    ``(logits_shard, StepInputs, StepPlan, q_full) -> StepOutput`` (a
    :class:`~vllm_kimi_ext.verify.graph_step.StepGraphs`, or a
    :class:`~vllm_kimi_ext.verify.graph_step.GraphVerifyStep`'s ``run``); its
    ``last_plan`` is set to the plan it ran. ``plan``: the gate's (re-planned from the
    same parameters if the logits shard's shape differs from the one it assumed)."""
    import torch
    from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
    from vllm.v1.worker.gpu.sample.output import SamplerOutput
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import gather_draft_sampled

    from vllm_kimi_ext.comm import phase
    from vllm_kimi_ext.verify.step_io import StepInputs

    sampler = runner.sampler
    states = sampler.sampling_states
    idx = input_batch.idx_mapping
    draft_sampled, pos = gather_draft_sampled(
        input_batch.input_ids, input_batch.positions, input_batch.logits_indices,
        input_batch.expanded_idx_mapping, input_batch.expanded_local_pos,
        sampler.req_states.prefill_len.gpu)
    width = runner.rejection_sampler.num_speculative_steps + 1
    cache = runner.speculator.draft_logits
    params = request_params(sampler, input_batch.idx_mapping_np)
    with phase("verify"):
        local = runner.model.compute_logits_local(hidden_states[input_batch.logits_indices])
        verifier = make_verifier(local.shape[-1])
        V = verifier.vocab_size
        inp = StepInputs.from_requests(
            input_batch.cu_num_logits, _bonus_layout_drafts(draft_sampled,
                                                            input_batch.cu_num_logits),
            states.temperature.gpu[idx], states.seeds.gpu[idx], pos, states.top_k.gpu[idx],
            states.min_p.gpu[idx], states.top_p.gpu[idx], V)
        shape = (int(local.shape[0]), int(local.shape[-1]), local.element_size())
        if plan is None or (plan.num_rows, plan.shard_width, plan.logits_bytes) != shape:
            plan = plan_from_params(
                params, tp_size=verifier.tp_size, vocab_size=V, num_rows=shape[0],
                max_rows_per_req=width, shard_width=shape[1], logits_bytes=shape[2],
                probabilistic=cache is not None)
            if isinstance(plan, Fallback):  # the gate accepted the same parameters
                raise RuntimeError(f"sharded verification re-planned to a fallback: {plan}")
        q = None
        if cache is not None:
            q = draft_probs_full(cache.values, input_batch.expanded_idx_mapping,
                                 input_batch.expanded_local_pos,
                                 states.temperature.gpu[input_batch.expanded_idx_mapping].float(),
                                 V)
        out = verifier(local, inp, plan, q)
        _count_on_device(out)
        verifier.last_plan = plan
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


class _Eager:
    """The step run eagerly (no CUDA graph), with the same call signature as StepGraphs."""

    def __init__(self, step):
        self.step = step

    def __call__(self, logits_shard, inp, plan, q_full=None):
        return self.step.run(logits_shard, inp, plan, q_full)

    def __getattr__(self, name):
        return getattr(self.step, name)


def _max_reqs(runner: Any) -> int:
    """Requests of the largest verification step (``max_num_seqs``, 256 if unknown)."""
    return int(getattr(getattr(runner, "scheduler_config", None), "max_num_seqs", None) or 256)


def _verifier(runner: Any, shard_width: int):
    """The runner's verifier for its lm_head's (padded) vocab shard: :class:`StepGraphs`
    (graphs captured by :func:`warm_up`) or the step run eagerly
    (``VLLM_KIMI_EXT_SHARDED_VERIFY_GRAPHS=0``), made once per shard width."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tp_group

    from vllm_kimi_ext import envs
    from vllm_kimi_ext.verify.graph_step import GraphVerifyStep, StepGraphs
    from vllm_kimi_ext.verify.ranks import group_coordinator_all_gather

    cache = runner.__dict__.setdefault(_VERIFIERS_ATTR, {})
    if shard_width not in cache:
        step = GraphVerifyStep(runner.model_config.get_vocab_size(), get_tp_group().world_size,
                               get_tensor_model_parallel_rank(),
                               group_coordinator_all_gather(get_tp_group()),
                               shard_width=shard_width)
        k = runner.rejection_sampler.num_speculative_steps
        cache[shard_width] = StepGraphs(step, max_reqs=_max_reqs(runner), rows_per_req=k + 1,
                                        log=logger) \
            if envs.SHARDED_VERIFY_GRAPHS.get() else _Eager(step)
    return cache[shard_width]


#: vLLM attributes :func:`warm_up` reads, ``(vLLM class, attribute)``; a missing one
#: skips the warm-up (logged; every step then runs eagerly, counted ``not_warmed_up``).
#: ``tests/canary/test_sharded_verify_gate.py`` checks each on vLLM 0.34.0.
WARM_UP_ATTRIBUTES = (
    (_RUNNER, "capture_model"), (_RUNNER, "device"), (_RUNNER, "model_config"),
    (_RUNNER, "rejection_sampler"), (_RUNNER, "speculator"), (_RUNNER, "model"),
    ("vllm.config.model.ModelConfig", "get_hidden_size"),
    ("vllm.config.model.ModelConfig", "get_vocab_size"),
    ("vllm.config.model.ModelConfig", "dtype"),
    (_SPEC, "draft_logits"),
)


def warm_up(runner: Any) -> int:
    """Capture the verification graphs before serving (called after vLLM's own
    ``capture_model``, on every rank in the same order). Returns how many were captured
    (0 when the step would not run sharded: TP = 1, no speculation, graphs off, or a
    vLLM attribute in :data:`WARM_UP_ATTRIBUTES` missing)."""
    try:
        return _warm_up(runner)
    except AttributeError as e:
        logger.warning("vllm-kimi-ext sharded verification: no verification graphs captured "
                       "(%s); every sharded step runs eagerly (counted not_warmed_up)", e)
        return 0


def _warm_up(runner: Any) -> int:
    import torch
    from vllm.distributed import get_tp_group

    from vllm_kimi_ext import envs

    if (get_tp_group().world_size <= 1 or runner.rejection_sampler is None
            or not envs.SHARDED_VERIFY_GRAPHS.get()
            or not hasattr(runner.model, "compute_logits_local")):
        return 0
    hidden = torch.zeros(1, runner.model_config.get_hidden_size(),
                         dtype=runner.model_config.dtype, device=runner.device)
    with torch.inference_mode():
        local = runner.model.compute_logits_local(hidden)
    graphs = _verifier(runner, int(local.shape[-1]))
    cache = runner.speculator.draft_logits
    n = graphs.warm_up(local.dtype, local.device, probabilistic=cache is not None,
                       q_width=runner.model_config.get_vocab_size())
    logger.info("vllm-kimi-ext sharded verification: %d verification graphs captured "
                "(%d request counts up to %d, k + 1 = %d rows each)", n,
                len(graphs.capture_sizes), graphs.max_reqs, graphs.rows_per_req)
    return n


def graph_counts(runner: Any) -> dict[str, int]:
    """Steps replayed from a captured graph and steps run without one (per reason)."""
    out: dict[str, int] = {"replayed": 0}
    for v in runner.__dict__.get(_VERIFIERS_ATTR, {}).values():
        out["replayed"] += getattr(v, "replayed", 0)
        for reason, n in getattr(v, "uncaptured", {}).items():
            out[f"uncaptured_{reason}"] = out.get(f"uncaptured_{reason}", 0) + n
    return out


def _periodic_log(runner: Any) -> None:
    if (_state["steps"] + _state["handed"]) % 1000 == 0:
        logger.info("vllm-kimi-ext sharded verification: %d steps, %d handed to batch-sharded "
                    "sampling, fallbacks %s, %s, graphs %s", _state["steps"], _state["handed"],
                    FALLBACKS.as_dict(), device_counts(), graph_counts(runner))


def sample_step(runner: Any, original: Any, hidden_states: Any, input_batch: Any,
                grammar_output: Any):
    """``GPUModelRunner.sample`` with sharded verification: an eligible
    verification step runs :func:`sharded_sample`; any other step runs
    ``original`` (the stock method, batch-sharded when vLLM's batch sharder is on): an
    ineligible verification step counted in :data:`FALLBACKS` with its reason, a step
    handed to batch-sharded sampling (:data:`HANDED_OVER`) counted as handed over."""
    from vllm.distributed import get_tp_group

    tp = get_tp_group().world_size
    vocab = runner.model_config.get_vocab_size()
    plan = gate(runner, input_batch, grammar_output, tp, vocab)
    if isinstance(plan, Fallback):
        if plan.reason == HANDED_OVER:
            _state["handed"] += 1
            _periodic_log(runner)
        elif plan.reason not in NOT_FALLBACKS:
            FALLBACKS.record(plan)
        return original(runner, hidden_states, input_batch, grammar_output)
    _state["steps"] += 1
    _periodic_log(runner)
    return sharded_sample(runner, hidden_states, input_batch,
                          lambda width: _verifier(runner, width), plan)

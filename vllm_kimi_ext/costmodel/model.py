"""The decode-step cost model: time, HBM bytes and collectives of one speculative step.

One step at batch ``B`` with ``k`` draft tokens is, in order (no overlap is assumed; each
pass is a CUDA-graph replay):

1. **target pass** over ``n = B (k + 1)`` tokens: weight streaming per GPU (bf16 MLA
   attention with its replicated ``fused_qkv_a_proj``, replicated router, bf16 shared
   expert and dense layer, INT4 routed experts for the *expected number of distinct
   experts* the ``n`` tokens touch, vocab-parallel bf16 lm_head), MLA latent KV reads (the
   fitted context cost), kernel launch gaps, and ``2 L + 1`` all-reduces of ``n x hidden``;
2. **verification**: the stock all-gather of ``[n, vocab]`` bf16 logits followed by a
   full-vocabulary sampler on every rank, or the vocabulary-sharded verifier (one small
   collective of <= 16 bytes per row per rank, sampler work on the local shard only);
3. **draft** (:mod:`.draft_cost`): ``k`` autoregressive forwards or one block pass;
4. fixed per-step overheads.

Time of a compute term is the roofline ``max(bytes / (BW * eta), flops / (peak * eff))``;
a collective costs ``table_latency(bytes, backend) + delta``. The free parameters are in
:mod:`.params`; their values are fitted by :mod:`.calibration` and read from the hardware
profile, so building a model never runs a fit.

Throughput per request is ``tau(k) / step_time``, aggregate ``B tau(k) / step_time``;
"per output token" figures divide a step's totals by the ``B tau(k)`` tokens it emits.
With ``k = 0`` the step is exactly the no-speculation decode step.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from vllm_kimi_ext.costmodel import draft_cost, verify_cost
from vllm_kimi_ext.costmodel.acceptance import Acceptance
from vllm_kimi_ext.costmodel.catalog import (
    DEFAULT_HARDWARE,
    DraftProfile,
    HardwareProfile,
    ModelProfile,
    load_hardware,
    load_model,
)
from vllm_kimi_ext.costmodel.latency import LatencyTable, load_latency_table
from vllm_kimi_ext.costmodel.params import CalibParams
from vllm_kimi_ext.costmodel.terms import Term

PLACEMENTS = draft_cost.PLACEMENTS
VOCABS = ("full", "reduced")
VERIFIERS = ("gather", "sharded")
COUNT_MODES = ("profile", "code")

#: Bytes each rank contributes per row to the vocabulary-sharded verifier where the measured
#: report has no measurement (the fallback: max / sum-exp / Gumbel-max value as fp32 + a
#: winning id; :func:`.verify_cost.sharded_terms` prices it from the report otherwise).
SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK = verify_cost.FALLBACK_BYTES_PER_ROW_PER_RANK
#: Bytes moved per logit by a full-vocabulary sampler (read bf16, write and read fp32 probs).
SAMPLER_BYTES_PER_LOGIT = 10
#: Size assumed for the unattributed per-step all-reduces of the public profile.
UNATTRIBUTED_ALLREDUCE_BYTES = 256


@dataclasses.dataclass(frozen=True)
class Plan:
    """One decode configuration to evaluate."""

    k: int = 0
    draft: DraftProfile | None = None
    placement: str = "tp8"
    vocab: str = "full"
    verifier: str = "gather"
    backend: str = "nccl"
    batch: int = 1
    context: int = 1024

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError("k must be >= 0")
        if self.k > 0 and self.draft is None:
            raise ValueError("k > 0 needs a draft")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}")
        if self.vocab not in VOCABS:
            raise ValueError(f"vocab must be one of {VOCABS}")
        if self.verifier not in VERIFIERS:
            raise ValueError(f"verifier must be one of {VERIFIERS}")
        if self.batch < 1 or self.context < 0:
            raise ValueError("batch must be >= 1 and context >= 0")

    @property
    def speculative(self) -> bool:
        return self.k > 0

    def label(self) -> str:
        if not self.speculative:
            return f"no-spec ({self.backend})"
        return (f"{self.draft.name} k={self.k} {self.placement}/{self.vocab} "
                f"{self.verifier} {self.backend}")


@dataclasses.dataclass(frozen=True)
class Variant:
    """What-if changes to how a step runs (levers not built yet; :mod:`.whatif`)."""

    verify_tokens_per_seq: float | None = None  # verified per sequence incl. bonus (k + 1)
    tau: float | None = None  # tokens emitted per step instead of acceptance.tau(k)
    hide_draft_behind_comm: bool = False  # draft compute overlapped with target AR waits
    name: str = ""


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    plan: Plan
    terms: tuple[Term, ...]
    tau: float
    memory_gb_per_gpu: float
    memory_budget_gb: float
    acceptance_source: str = ""

    @property
    def step_s(self) -> float:
        return sum(t.time_s for t in self.terms)

    @property
    def tokens_per_step(self) -> float:
        return self.plan.batch * self.tau

    @property
    def tokens_per_s_per_request(self) -> float:
        return self.tau / self.step_s

    @property
    def tokens_per_s(self) -> float:
        """Aggregate output tokens per second over the batch."""
        return self.tokens_per_step / self.step_s

    @property
    def fits(self) -> bool:
        return self.memory_gb_per_gpu <= self.memory_budget_gb

    def total(self, field: str, phase: str | None = None) -> float:
        return sum(getattr(t, field) for t in self.terms if phase is None or t.phase == phase)

    @property
    def collectives_per_step(self) -> int:
        return int(self.total("collectives"))

    @property
    def collectives_per_token(self) -> float:
        return self.collectives_per_step / self.tokens_per_step

    @property
    def comm_bytes_per_token(self) -> float:
        return self.total("comm_bytes") / self.tokens_per_step

    @property
    def hbm_bytes_per_token(self) -> float:
        return self.total("hbm_bytes") / self.tokens_per_step

    @property
    def allreduce_time_s(self) -> float:
        return sum(t.time_s for t in self.terms if t.allreduces and t.allreduces == t.collectives)

    def by_phase(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for t in self.terms:
            for f in ("time_s", "hbm_bytes", "collectives", "comm_bytes"):
                out[t.phase][f] += getattr(t, f)
        return {p: dict(v) for p, v in out.items()}

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        return {
            "label": p.label(),
            "draft": p.draft.name if p.draft else None,
            "k": p.k,
            "placement": p.placement if p.speculative else None,
            "vocab": p.vocab if p.speculative else None,
            "verifier": p.verifier if p.speculative else "gather",
            "backend": p.backend,
            "batch": p.batch,
            "context": p.context,
            "tau": self.tau,
            "step_ms": self.step_s * 1e3,
            "tokens_per_s_per_request": self.tokens_per_s_per_request,
            "tokens_per_s": self.tokens_per_s,
            "collectives_per_step": self.collectives_per_step,
            "collectives_per_token": self.collectives_per_token,
            "comm_bytes_per_token": self.comm_bytes_per_token,
            "comm_bytes_per_rank_per_token": self.total("comm_bytes_per_rank")
            / self.tokens_per_step,
            "hbm_bytes_per_token": self.hbm_bytes_per_token,
            "memory_gb_per_gpu": self.memory_gb_per_gpu,
            "memory_budget_gb": self.memory_budget_gb,
            "fits": self.fits,
            "acceptance_source": self.acceptance_source,
            "by_phase": self.by_phase(),
        }


class CostModel:
    """Decode cost of Kimi-K2.5 (or another DeepSeek-V3-shaped model) on one box."""

    def __init__(self, model: ModelProfile, hardware: HardwareProfile, latency: LatencyTable,
                 params: CalibParams, count_mode: str = "profile"):
        if count_mode not in COUNT_MODES:
            raise ValueError(f"count_mode must be one of {COUNT_MODES}")
        self.model = model
        self.hw = hardware
        self.latency = latency
        self.params = params
        self.count_mode = count_mode

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def build(cls, hardware: str | HardwareProfile = DEFAULT_HARDWARE,
              model: str | ModelProfile = "kimi-k2.5", params: CalibParams | str = "calibrated",
              count_mode: str = "profile", latency: str | LatencyTable | None = None
              ) -> CostModel:
        """A model for a named box. ``params``: ``"calibrated"`` (the fit committed in the
        hardware profile; its priors when it has none), ``"prior"``, or explicit
        :class:`CalibParams`. ``latency`` replaces the box's latency table."""
        hw = hardware if isinstance(hardware, HardwareProfile) else load_hardware(hardware)
        mp = model if isinstance(model, ModelProfile) else load_model(model)
        if isinstance(latency, LatencyTable):
            table = latency
        else:
            table = load_latency_table(latency or hw.latency_table)
        if isinstance(params, CalibParams):
            chosen = params
        elif params == "prior":
            chosen = prior_params(hw)
        elif params == "calibrated":
            chosen = fitted_params(hw) or prior_params(hw)
        else:
            raise ValueError("params must be 'calibrated', 'prior' or CalibParams")
        return cls(mp, hw, table, chosen, count_mode)

    def with_params(self, params: CalibParams) -> CostModel:
        return CostModel(self.model, self.hw, self.latency, params, self.count_mode)

    def with_hardware(self, hw: HardwareProfile) -> CostModel:
        return CostModel(self.model, hw, self.latency, self.params, self.count_mode)

    def with_latency(self, table: LatencyTable) -> CostModel:
        return CostModel(self.model, self.hw, table, self.params, self.count_mode)

    def with_model(self, model: ModelProfile) -> CostModel:
        return CostModel(model, self.hw, self.latency, self.params, self.count_mode)

    # -- primitives ---------------------------------------------------------------------------
    @property
    def tp(self) -> int:
        return self.hw.tp

    @property
    def backends(self) -> list[str]:
        return [b for b in self.hw.backends if b in self.latency.backends]

    def bandwidth(self) -> float:
        return self.hw.memory_bandwidth_GBps * 1e9 * self.params.bandwidth_efficiency

    def _flops_rate(self) -> float:
        return self.hw.peak_bf16_tflops * 1e12 * self.params.compute_efficiency

    def compute(self, phase: str, name: str, nbytes: float, flops: float,
                kernels: float = 0.0, read_factor: float = 1.0) -> Term:
        t = max(nbytes * read_factor / self.bandwidth(), flops / self._flops_rate())
        t += kernels * self.params.kernel_gap_us * 1e-6
        return Term(phase, name, time_s=t, hbm_bytes=nbytes, flops=flops)

    def collective_us(self, op: str, nbytes: float, backend: str) -> float:
        """In-situ latency of one collective: table latency + calibrated overhead."""
        return self.latency.latency_us(op, nbytes, backend) + self.params.collective_overhead_us

    def collective(self, phase: str, name: str, op: str, count: int, nbytes: float,
                   backend: str, per_rank_bytes: float | None = None) -> Term:
        if count <= 0:
            return Term(phase, name)
        t = count * self.collective_us(op, nbytes, backend) * 1e-6
        per_rank = nbytes if per_rank_bytes is None else per_rank_bytes
        return Term(phase, name, time_s=t, collectives=count,
                    allreduces=count if op == "allreduce" else 0,
                    comm_bytes=count * nbytes, comm_bytes_per_rank=count * per_rank)

    def distinct_experts(self, n_tokens: float, batch: float | None = None) -> float:
        """Expected distinct routed experts per MoE layer for ``n_tokens`` tokens of
        ``batch`` sequences (default: independent tokens), with the fitted routing."""
        return self.model.expected_distinct_experts(
            n_tokens, skew=self.params.routing_skew, popularity=self.params.expert_popularity,
            batch=n_tokens if batch is None else batch)

    # -- target -----------------------------------------------------------------------------
    def target_weight_bytes(self, n_tokens: float, batch: float | None = None
                            ) -> dict[str, float]:
        """Weight bytes each GPU streams in one target pass over ``n_tokens`` tokens of
        ``batch`` sequences (default: independent tokens)."""
        m, tp, b = self.model, self.tp, self.model.dtype_bytes
        rep, shd = m.mla_params()
        return {
            "attention": m.num_layers * (rep + shd / tp) * b,
            "dense_mlp": m.first_k_dense_replace * m.dense_mlp_params() / tp * b,
            "router": m.num_moe_layers * m.router_params() * m.router_dtype_bytes,
            "shared_experts": m.num_moe_layers * m.n_shared_experts * m.expert_params() / tp * b,
            "routed_experts": m.num_moe_layers * self.distinct_experts(n_tokens, batch)
            * m.expert_params() / tp * m.routed_expert_bits_per_weight / 8,
            "lm_head": m.lm_head_params() / tp * b,
        }

    def kv_bytes_per_token(self) -> float:
        """MLA latent cache bytes per context token (all layers; replicated over TP)."""
        m = self.model
        return m.num_layers * m.kv_latent_dim * m.kv_cache_dtype_bytes

    def kv_read_bytes(self, batch: int, context: int, tokens_per_seq: float) -> float:
        """Latent KV bytes one pass reads: each sequence's cache once, plus the fitted share
        of it again for every further token of that sequence in the pass."""
        extra = self.params.kv_query_share * max(tokens_per_seq - 1.0, 0.0)
        return batch * context * self.kv_bytes_per_token() * (1.0 + extra)

    def target_pass(self, n_tokens: float, batch: int, context: int, backend: str
                    ) -> list[Term]:
        m, tp = self.model, self.tp
        w = self.target_weight_bytes(n_tokens, batch)
        rep, shd = m.mla_params()
        heads = m.num_attention_heads / tp
        terms = [
            self.compute("target", "attention weights", w["attention"],
                         2 * n_tokens * m.num_layers * (rep + shd / tp)),
            self.compute(
                "target", "attention KV reads", self.kv_read_bytes(batch, context,
                                                                   n_tokens / batch),
                2 * n_tokens * m.num_layers * heads * context * (m.kv_latent_dim + m.kv_lora_rank),
                read_factor=self.params.kv_read_factor),
            self.compute("target", "dense layer MLP", w["dense_mlp"],
                         2 * n_tokens * w["dense_mlp"] / m.dtype_bytes),
            self.compute("target", "router", w["router"],
                         2 * n_tokens * m.num_moe_layers * m.router_params()),
            self.compute("target", "shared experts", w["shared_experts"],
                         2 * n_tokens * w["shared_experts"] / m.dtype_bytes),
            self.compute("target", "routed experts (INT4)", w["routed_experts"],
                         2 * n_tokens * m.num_moe_layers * m.num_experts_per_tok
                         * m.expert_params() / tp),
            self.compute("target", "lm_head", w["lm_head"],
                         2 * n_tokens * m.lm_head_params() / tp),
        ]
        k = m.kernels
        n_kernels = (m.first_k_dense_replace * k["dense_layer"]
                     + m.num_moe_layers * k["moe_layer"] + k["per_pass"])
        terms.append(Term("target", "kernel launch gaps",
                          time_s=n_kernels * self.params.kernel_gap_us * 1e-6))
        terms.append(self.collective("target", "all-reduce (layers + embedding)", "allreduce",
                                     self.code_allreduce_per_pass(),
                                     n_tokens * m.hidden_size * m.dtype_bytes, backend))
        return terms

    def code_allreduce_per_pass(self) -> int:
        c = self.model.collectives
        return self.model.num_layers * c["allreduce_per_layer"] + c["embedding_allreduce"]

    # -- verification -------------------------------------------------------------------------
    def verification(self, rows: float, verifier: str, backend: str,
                     k: int | None = None) -> list[Term]:
        """The verify phase: ``gather`` priced by the model; ``sharded`` from the measured
        report at ``(rows, k)`` (Kimi's T = 1.0 / top_p 0.95), else the constant fallback,
        labelled as such."""
        m, tp = self.model, self.tp
        v = m.vocab_size
        kern = m.kernels["sampler"]
        gathers = int(m.collectives.get("logits_allgather", 1))
        if verifier == "gather":
            total = rows * v * m.dtype_bytes
            return [
                self.collective("verify", "logits all-gather [rows, vocab] bf16", "allgather",
                                gathers, total, "nccl", per_rank_bytes=total / tp),
                self.compute("verify", "sampler over full vocabulary",
                             rows * v * SAMPLER_BYTES_PER_LOGIT, 0.0, kern),
            ]
        if verifier != "sharded":
            raise ValueError(f"unknown verifier {verifier!r}")
        measured = verify_cost.sharded_terms(self, rows, k)
        if measured is not None:
            return measured
        per_rank = rows * SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK
        total = per_rank * tp
        # The implementation may use whichever carries the tiny payload faster.
        fast = min((backend, "nccl"), key=lambda b: self.latency.latency_us("allgather", total, b))
        return [
            self.collective("verify", f"sharded verifier gather ({fast}; constant fallback: "
                            f"{SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK} B per row, not "
                            "measured here)", "allgather", gathers, total, fast,
                            per_rank_bytes=per_rank),
            self.compute("verify", "sampler over local vocabulary shard (constant fallback: "
                         "not measured here)", rows * v / tp * SAMPLER_BYTES_PER_LOGIT, 0.0,
                         kern + 2),
        ]

    # -- draft (delegated) ----------------------------------------------------------------
    def draft_vocab(self, draft: DraftProfile, vocab: str) -> int:
        return draft_cost.draft_vocab(self, draft, vocab)

    def vocab_options(self, draft: DraftProfile) -> list[str]:
        return draft_cost.vocab_options(self, draft)

    def placement_options(self, draft: DraftProfile) -> list[str]:
        return draft_cost.placement_options(draft)

    def draft_forward_bytes(self, draft: DraftProfile, placement: str, vocab: str,
                            n_tokens: int = 1) -> float:
        return draft_cost.forward_bytes(self, draft, placement, vocab, n_tokens)

    def draft_step(self, draft: DraftProfile, k: int, batch: int, context: int,
                   placement: str, vocab: str, backend: str) -> list[Term]:
        return draft_cost.step_terms(self, draft, k, batch, context, placement, vocab, backend)

    # -- memory -------------------------------------------------------------------------------
    def target_memory_bytes(self) -> float:
        m, tp, b = self.model, self.tp, self.model.dtype_bytes
        rep, shd = m.mla_params()
        return (m.num_layers * (rep + shd / tp) * b
                + m.first_k_dense_replace * m.dense_mlp_params() / tp * b
                + m.num_moe_layers * m.router_params() * m.router_dtype_bytes
                + m.num_moe_layers * m.n_shared_experts * m.expert_params() / tp * b
                + m.num_moe_layers * m.n_routed_experts * m.expert_params() / tp
                * m.routed_expert_bits_per_weight / 8
                + 2 * m.lm_head_params() / tp * b)  # embedding + lm_head

    def memory_gb(self, plan: Plan) -> float:
        total = self.target_memory_bytes()
        total += plan.batch * (plan.context + plan.k + 1) * self.kv_bytes_per_token()
        if plan.speculative:
            total += draft_cost.memory_bytes(self, plan.draft, plan.placement, plan.vocab)
            total += plan.batch * plan.context * draft_cost.kv_bytes_per_token(
                self, plan.draft, plan.placement)
        return total / 1e9 + self.hw.reserved_memory_GB

    # -- acceptance ------------------------------------------------------------------------
    def effective_acceptance(self, plan: Plan, acceptance: Acceptance) -> Acceptance:
        if (plan.vocab == "reduced" and self.draft_vocab(plan.draft, "reduced") <
                plan.draft.vocab_size):
            return acceptance.scaled(self.model.reduced_vocab_coverage,
                                     "reduced-vocab coverage")
        return acceptance

    # -- the step ------------------------------------------------------------------------------
    def estimate(self, plan: Plan, acceptance: Acceptance | None = None,
                 variant: Variant | None = None) -> StepEstimate:
        """Cost of one decode step of ``plan``; ``acceptance`` is needed when ``k > 0``."""
        if plan.backend not in self.latency.backends:
            raise KeyError(f"backend {plan.backend!r} unknown on {self.hw.name}; "
                           f"valid: {', '.join(self.backends)}")
        b = plan.batch
        variant = variant or Variant()
        if not plan.speculative:
            terms = self.target_pass(b, b, plan.context, plan.backend)
            terms += self.verification(b, "gather", plan.backend)
            tau, source = 1.0, "no speculation"
        else:
            terms, tau, source = self._speculative_terms(plan, acceptance, variant)
        if self.count_mode == "profile":
            extra = int(self.model.collectives.get("unattributed_allreduce_per_step", 0))
            terms.append(self.collective("overhead", "unattributed all-reduce (profile)",
                                         "allreduce", extra, UNATTRIBUTED_ALLREDUCE_BYTES,
                                         plan.backend))
        terms.append(Term("overhead", "per-step host overhead",
                          time_s=self.hw.step_overhead_us * 1e-6))
        terms = [t for t in terms if t.time_s or t.hbm_bytes or t.collectives]
        budget = self.hw.memory_capacity_GB * self.hw.gpu_memory_utilization
        return StepEstimate(plan, tuple(terms), tau, self.memory_gb(plan), budget, source)

    def _speculative_terms(self, plan: Plan, acceptance: Acceptance | None,
                           variant: Variant) -> tuple[list[Term], float, str]:
        if acceptance is None:
            raise ValueError("k > 0 needs an acceptance model")
        if plan.k > plan.draft.max_k:
            raise ValueError(f"{plan.draft.name} proposes at most {plan.draft.max_k} tokens")
        b = plan.batch
        per_seq = variant.verify_tokens_per_seq or (plan.k + 1)
        n = b * per_seq
        terms = self.target_pass(n, b, plan.context, plan.backend)
        terms += self.verification(n, plan.verifier, plan.backend,
                                   k=plan.k if per_seq == plan.k + 1 else None)
        draft = self.draft_step(plan.draft, plan.k, b, plan.context, plan.placement,
                                plan.vocab, plan.backend)
        if variant.hide_draft_behind_comm:
            # upper bound: draft compute runs entirely inside the target's all-reduce waits
            compute = sum(t.time_s for t in draft if not t.collectives)
            waits = sum(t.time_s for t in terms if t.phase == "target" and t.collectives)
            keep = 1.0 - min(compute, waits) / compute if compute else 1.0
            draft = [t if t.collectives else dataclasses.replace(t, time_s=t.time_s * keep)
                     for t in draft]
        terms += draft
        acc = self.effective_acceptance(plan, acceptance)
        tau = variant.tau if variant.tau is not None else acc.tau(plan.k)
        terms.append(Term("overhead", "speculation bookkeeping",
                          time_s=self.params.spec_step_overhead_us * 1e-6))
        return terms, tau, acc.source

    def no_spec(self, batch: int = 1, context: int = 1024,
                backend: str = "nccl") -> StepEstimate:
        return self.estimate(Plan(k=0, backend=backend, batch=batch, context=context))


def prior_params(hw: HardwareProfile) -> CalibParams:
    """The hardware profile's ``calibration.priors`` (the values used before any fit)."""
    pr = hw.calibration.get("priors")
    if pr is None:
        return CalibParams(0.7, 0.0, note=f"default priors ({hw.name} states none)")
    return CalibParams.from_dict(pr, f"hardware profile {hw.name!r}: field "
                                     "'calibration.priors'",
                                 note=f"priors of {hw.name} (nothing fitted)")


def fitted_params(hw: HardwareProfile) -> CalibParams | None:
    """The committed fit (``calibration.fitted``), or None for a box never calibrated."""
    fit = hw.calibration.get("fitted")
    if not fit:
        return None
    return CalibParams.from_dict(fit, f"hardware profile {hw.name!r}: field "
                                      "'calibration.fitted'", calibrated=True,
                                 note=fit.get("note", f"fitted on {hw.name}'s calibration "
                                                      "points"))

"""The decode-step cost model: time, HBM bytes and collectives of one speculative step.

One step at batch ``B`` with ``k`` draft tokens is, in order (no overlap is assumed; each
pass is a CUDA-graph replay):

1. **target pass** over ``n = B (k + 1)`` tokens: weight streaming per GPU (bf16 MLA
   attention with its replicated ``fused_qkv_a_proj``, replicated router, bf16 shared
   expert and dense layer, INT4 routed experts for the *expected number of distinct
   experts* the ``n`` tokens touch, vocab-parallel bf16 lm_head), MLA latent KV reads,
   kernel launch gaps, and ``2 L + 1`` all-reduces of ``n x hidden`` bf16;
2. **verification**: the stock all-gather of ``[n, vocab]`` bf16 logits followed by a
   full-vocabulary sampler on every rank, or the vocabulary-sharded verifier (one small
   collective of <= 16 bytes per row per rank, sampler work on the local shard only);
3. **draft**: ``k`` autoregressive forwards (the first over all ``n`` verified positions,
   the rest over ``B`` tokens) or one pass for a block drafter; at TP=8 each forward costs
   ``2 L + 2`` collectives (embedding all-reduce, two per layer, a top-token gather), at
   TP=1 none but every rank streams the whole draft;
4. fixed per-step overheads.

Time of a compute term is the roofline ``max(bytes / (BW * eta), flops / (peak * eff))``;
a collective costs ``table_latency(bytes, backend) + delta``. ``eta`` (achieved bandwidth
fraction) and ``delta`` (in-situ overhead per collective: rank skew and launch) are the two
calibrated parameters (:mod:`.calibration`).

Throughput per request is ``tau(k) / step_time``, aggregate ``B tau(k) / step_time``;
"per output token" figures divide a step's totals by the ``B tau(k)`` tokens it emits.
With ``k = 0`` the step is exactly the no-speculation decode step.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from vllm_kimi_ext.costmodel.acceptance import Acceptance
from vllm_kimi_ext.costmodel.catalog import (
    DraftProfile,
    HardwareProfile,
    ModelProfile,
    load_hardware,
    load_model,
)
from vllm_kimi_ext.costmodel.latency import LatencyTable, load_latency_table

PLACEMENTS = ("tp1", "tp8")
VOCABS = ("full", "reduced")
VERIFIERS = ("gather", "sharded")
COUNT_MODES = ("profile", "code")

#: Bytes each rank contributes per row to the vocabulary-sharded verifier (max / sum-exp /
#: Gumbel-max value as fp32 + a winning id as int32).
SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK = 16
#: Bytes each rank contributes per row to a draft's local-argmax top-token gather.
TOP_TOKEN_BYTES_PER_ROW_PER_RANK = 8
#: Bytes moved per logit by a full-vocabulary sampler (read bf16, write and read fp32 probs).
SAMPLER_BYTES_PER_LOGIT = 10
#: Size assumed for the unattributed per-step all-reduces of the public profile.
UNATTRIBUTED_ALLREDUCE_BYTES = 256
#: Kernels of a small draft decoder layer and of a draft forward's head/embedding.
DRAFT_KERNELS_PER_LAYER = {"llama": 14, "mla": 18, "mla_moe": 24}
DRAFT_KERNELS_PER_FORWARD = 6


@dataclasses.dataclass(frozen=True)
class CalibParams:
    """The free parameters: achieved bandwidth fraction and in-situ collective overhead."""

    bandwidth_efficiency: float
    collective_overhead_us: float
    calibrated: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        # Only what would make the arithmetic meaningless is refused here: the fit explores
        # unconstrained points (eta > 1, delta < 0) before clamping to its bounds.
        if not self.bandwidth_efficiency > 0:
            raise ValueError("bandwidth_efficiency must be > 0")

    @property
    def physical(self) -> bool:
        """Within what hardware allows: eta <= 1 and a non-negative overhead."""
        return self.bandwidth_efficiency <= 1.0 and self.collective_overhead_us >= 0.0


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
class Term:
    """One line of a step's breakdown."""

    phase: str  # target | verify | draft | overhead
    name: str
    time_s: float = 0.0
    hbm_bytes: float = 0.0
    flops: float = 0.0
    collectives: int = 0
    allreduces: int = 0
    comm_bytes: float = 0.0  # message size: AR buffer, or gathered output
    comm_bytes_per_rank: float = 0.0  # what this rank contributes (comm.accounting convention)


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

    def __init__(
        self,
        model: ModelProfile,
        hardware: HardwareProfile,
        latency: LatencyTable,
        params: CalibParams,
        count_mode: str = "profile",
    ):
        if count_mode not in COUNT_MODES:
            raise ValueError(f"count_mode must be one of {COUNT_MODES}")
        self.model = model
        self.hw = hardware
        self.latency = latency
        self.params = params
        self.count_mode = count_mode

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        hardware: str | HardwareProfile = "rtx-pro-6000-pcie-x8",
        model: str | ModelProfile = "kimi-k2.5",
        params: CalibParams | str = "calibrated",
        count_mode: str = "profile",
    ) -> CostModel:
        """A model for a named box. ``params``: ``"calibrated"`` (fit to the box's published
        figures, priors when it has none), ``"prior"``, or explicit :class:`CalibParams`."""
        hw = hardware if isinstance(hardware, HardwareProfile) else load_hardware(hardware)
        mp = model if isinstance(model, ModelProfile) else load_model(model)
        table = load_latency_table(hw.latency_table)
        prior = prior_params(hw)
        if isinstance(params, CalibParams):
            return cls(mp, hw, table, params, count_mode)
        if params == "prior":
            return cls(mp, hw, table, prior, count_mode)
        if params != "calibrated":
            raise ValueError("params must be 'calibrated', 'prior' or CalibParams")
        from vllm_kimi_ext.costmodel.calibration import calibrate

        base = cls(mp, hw, table, prior, count_mode)
        return base.with_params(calibrate(base).params)

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

    def _bw(self) -> float:
        return self.hw.memory_bandwidth_GBps * 1e9 * self.params.bandwidth_efficiency

    def _flops_rate(self) -> float:
        return self.hw.peak_bf16_tflops * 1e12 * self.hw.compute_efficiency

    def _compute(self, phase: str, name: str, nbytes: float, flops: float,
                 kernels: float = 0.0) -> Term:
        t = max(nbytes / self._bw(), flops / self._flops_rate())
        t += kernels * self.hw.kernel_gap_us * 1e-6
        return Term(phase, name, time_s=t, hbm_bytes=nbytes, flops=flops)

    def collective_us(self, op: str, nbytes: float, backend: str) -> float:
        """In-situ latency of one collective: table latency + calibrated overhead."""
        return self.latency.latency_us(op, nbytes, backend) + self.params.collective_overhead_us

    def _collective(self, phase: str, name: str, op: str, count: int, nbytes: float,
                    backend: str, per_rank_bytes: float | None = None) -> Term:
        if count <= 0:
            return Term(phase, name)
        t = count * self.collective_us(op, nbytes, backend) * 1e-6
        per_rank = nbytes if per_rank_bytes is None else per_rank_bytes
        return Term(phase, name, time_s=t, collectives=count,
                    allreduces=count if op == "allreduce" else 0,
                    comm_bytes=count * nbytes, comm_bytes_per_rank=count * per_rank)

    # -- target -----------------------------------------------------------------------------
    def target_weight_bytes(self, n_tokens: float) -> dict[str, float]:
        """Weight bytes each GPU streams in one target pass over ``n_tokens`` tokens."""
        m, tp, b = self.model, self.tp, self.model.dtype_bytes
        rep, shd = m.mla_params()
        e_d = m.expected_distinct_experts(n_tokens)
        return {
            "attention": m.num_layers * (rep + shd / tp) * b,
            "dense_mlp": m.first_k_dense_replace * m.dense_mlp_params() / tp * b,
            "router": m.num_moe_layers * m.router_params() * m.router_dtype_bytes,
            "shared_experts": m.num_moe_layers * m.n_shared_experts * m.expert_params() / tp * b,
            "routed_experts": m.num_moe_layers * e_d * m.expert_params() / tp
            * m.routed_expert_bits_per_weight / 8,
            "lm_head": m.lm_head_params() / tp * b,
        }

    def kv_bytes_per_token(self) -> float:
        """MLA latent cache bytes per context token (all layers; replicated over TP)."""
        m = self.model
        return m.num_layers * m.kv_latent_dim * m.kv_cache_dtype_bytes

    def target_pass(self, n_tokens: int, batch: int, context: int, backend: str) -> list[Term]:
        m, tp = self.model, self.tp
        w = self.target_weight_bytes(n_tokens)
        rep, shd = m.mla_params()
        heads = m.num_attention_heads / tp
        terms = [
            self._compute("target", "attention weights", w["attention"],
                          2 * n_tokens * m.num_layers * (rep + shd / tp)),
            self._compute(
                "target", "attention KV reads", batch * context * self.kv_bytes_per_token(),
                2 * n_tokens * m.num_layers * heads * context * (m.kv_latent_dim + m.kv_lora_rank)),
            self._compute("target", "dense layer MLP", w["dense_mlp"],
                          2 * n_tokens * w["dense_mlp"] / m.dtype_bytes),
            self._compute("target", "router", w["router"],
                          2 * n_tokens * m.num_moe_layers * m.router_params()),
            self._compute("target", "shared experts", w["shared_experts"],
                          2 * n_tokens * w["shared_experts"] / m.dtype_bytes),
            self._compute("target", "routed experts (INT4)", w["routed_experts"],
                          2 * n_tokens * m.num_moe_layers * m.num_experts_per_tok
                          * m.expert_params() / tp),
            self._compute("target", "lm_head", w["lm_head"],
                          2 * n_tokens * m.lm_head_params() / tp),
        ]
        k = m.kernels
        n_kernels = (m.first_k_dense_replace * k["dense_layer"]
                     + m.num_moe_layers * k["moe_layer"] + k["per_pass"])
        terms.append(Term("target", "kernel launch gaps",
                          time_s=n_kernels * self.hw.kernel_gap_us * 1e-6))
        c = m.collectives
        n_ar = m.num_layers * c["allreduce_per_layer"] + c["embedding_allreduce"]
        terms.append(self._collective("target", "all-reduce (layers + embedding)", "allreduce",
                                      n_ar, n_tokens * m.hidden_size * m.dtype_bytes, backend))
        return terms

    def code_allreduce_per_pass(self) -> int:
        c = self.model.collectives
        return self.model.num_layers * c["allreduce_per_layer"] + c["embedding_allreduce"]

    # -- verification -------------------------------------------------------------------------
    def verification(self, rows: int, verifier: str, backend: str) -> list[Term]:
        m, tp = self.model, self.tp
        v = m.vocab_size
        kern = m.kernels["sampler"]
        if verifier == "gather":
            total = rows * v * m.dtype_bytes
            return [
                self._collective("verify", "logits all-gather [rows, vocab] bf16", "allgather",
                                 _logits_collectives(m), total, "nccl", per_rank_bytes=total / tp),
                self._compute("verify", "sampler over full vocabulary",
                              rows * v * SAMPLER_BYTES_PER_LOGIT, 0.0, kern),
            ]
        if verifier != "sharded":
            raise ValueError(f"unknown verifier {verifier!r}")
        per_rank = rows * SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK
        total = per_rank * tp
        # The implementation may use whichever carries the tiny payload faster.
        fast = min((backend, "nccl"),
                   key=lambda b: self.latency.latency_us("allgather", total, b))
        return [
            self._collective("verify", f"sharded verifier gather ({fast})", "allgather",
                             _logits_collectives(m), total, fast, per_rank_bytes=per_rank),
            self._compute("verify", "sampler over local vocabulary shard",
                          rows * v / tp * SAMPLER_BYTES_PER_LOGIT, 0.0, kern + 2),
        ]

    # -- draft ------------------------------------------------------------------------------
    def draft_vocab(self, draft: DraftProfile, vocab: str) -> int:
        if vocab == "full":
            return draft.vocab_size
        return min(draft.vocab_size, self.model.reduced_draft_vocab_size)

    def vocab_options(self, draft: DraftProfile) -> list[str]:
        """'reduced' only when it actually shrinks the draft's head."""
        if draft.vocab_size > self.model.reduced_draft_vocab_size:
            return ["full", "reduced"]
        return ["full"]

    def _draft_parts(self, draft: DraftProfile, tp: int, vocab: str,
                     n_tokens: float) -> tuple[dict[str, tuple[float, float]],
                                               dict[str, float], float]:
        """Per-forward parts as {name: (bytes per GPU, flops per token)}, parts read once per
        step (fc), and the draft's KV-cache bytes per context token per GPU."""
        a, m = draft.architecture, self.model
        b = m.dtype_bytes
        h = a.get("hidden_size", m.hidden_size)
        v = self.draft_vocab(draft, vocab)
        layers = draft.num_layers
        parts: dict[str, tuple[float, float]] = {}
        once: dict[str, float] = {}
        kind = a.get("layer")
        if "weight_bytes" in a:  # published checkpoint size, all of it read every pass
            wb = float(a["weight_bytes"]) / tp
            parts["layers (checkpoint bytes)"] = (wb, 2 * wb / b)
        elif kind == "llama":
            nh, nkv, hd = a["num_attention_heads"], a["num_key_value_heads"], a["head_dim"]
            inter = a["intermediate_size"]
            attn = 0.0
            for i in range(layers):
                qkv_in = 2 * h if i == 0 else h  # EAGLE-3: [embedding, hidden] in layer 0
                attn += qkv_in * (nh + 2 * nkv) * hd + nh * hd * h
            mlp = layers * 3 * h * inter
            parts["attention"] = (attn / tp * b, 2 * attn / tp)
            parts["mlp"] = (mlp / tp * b, 2 * mlp / tp)
        elif kind in ("mla", "mla_moe"):
            rep = shd = 0.0
            for i in range(layers):
                r, s = m.mla_params(input_size=2 * h if (i == 0 and kind == "mla") else h)
                rep, shd = rep + r, shd + s
            parts["attention (MLA)"] = ((rep + shd / tp) * b, 2 * (rep + shd / tp))
            if kind == "mla":
                mlp = layers * 3 * h * a["intermediate_size"]
                parts["mlp"] = (mlp / tp * b, 2 * mlp / tp)
            else:
                e_d = m.expected_distinct_experts(n_tokens)
                ex = m.expert_params()
                parts["router"] = (layers * m.router_params() * m.router_dtype_bytes,
                                   2 * layers * m.router_params())
                parts["shared expert"] = (layers * m.n_shared_experts * ex / tp * b,
                                          2 * layers * m.n_shared_experts * ex / tp)
                parts["routed experts (INT4)"] = (
                    layers * e_d * ex / tp * m.routed_expert_bits_per_weight / 8,
                    2 * layers * m.num_experts_per_tok * ex / tp)
                parts["eh_proj (replicated)"] = (2 * h * h * b, 2 * 2 * h * h)
        else:
            raise ValueError(f"draft {draft.name}: unknown layer type {kind!r}")
        parts["lm_head"] = (v * h / tp * b, 2 * v * h / tp)
        if draft.kind in ("eagle3", "eagle3_mla"):
            n_aux = a.get("num_aux_hidden_states", 3)
            once["fc (replicated)"] = n_aux * m.hidden_size * h * b
        # KV cache bytes per context token per GPU
        if kind == "llama":
            nkv, hd = a["num_key_value_heads"], a["head_dim"]
            kv_tok = layers * 2 * nkv * hd * m.kv_cache_dtype_bytes / min(tp, nkv)
        else:
            kv_tok = layers * m.kv_latent_dim * m.kv_cache_dtype_bytes
        return parts, once, kv_tok

    def draft_forward_bytes(self, draft: DraftProfile, placement: str, vocab: str,
                            n_tokens: int = 1) -> float:
        """Weight bytes one GPU streams in one draft forward (without the once-per-step fc)."""
        tp = self.tp if placement == "tp8" else 1
        parts, _, _ = self._draft_parts(draft, tp, vocab, n_tokens)
        return sum(p[0] for p in parts.values())

    def draft_forwards(self, draft: DraftProfile, k: int, batch: int) -> list[int]:
        """Tokens processed by each draft forward of one step."""
        if k == 0:
            return []
        n_all = batch * (k + 1)
        if draft.proposal == "one_pass":
            return [n_all]
        return [n_all] + [batch] * (k - 1)

    def draft_step(self, draft: DraftProfile, k: int, batch: int, context: int,
                   placement: str, vocab: str, backend: str) -> list[Term]:
        if k == 0:
            return []
        tp = self.tp if placement == "tp8" else 1
        m = self.model
        forwards = self.draft_forwards(draft, k, batch)
        terms: list[Term] = []
        kern_layer = DRAFT_KERNELS_PER_LAYER.get(draft.architecture.get("layer"), 14)
        for i, n in enumerate(forwards):
            parts, once, kv_tok = self._draft_parts(draft, tp, vocab, n)
            nbytes = sum(p[0] for p in parts.values())
            flops = n * sum(p[1] for p in parts.values())
            kernels = draft.num_layers * kern_layer + DRAFT_KERNELS_PER_FORWARD
            if i == 0 and once:
                fc = sum(once.values())
                nbytes += fc
                flops += 2 * n * fc / m.dtype_bytes
                kernels += 2
            terms.append(self._compute("draft", f"forward {i + 1} weights ({n} tok)",
                                       nbytes, flops, kernels))
            terms.append(self._compute("draft", f"forward {i + 1} KV reads",
                                       batch * context * kv_tok, 0.0))
            if tp > 1:
                h_bytes = n * draft.architecture.get("hidden_size", m.hidden_size) * m.dtype_bytes
                terms.append(self._collective(
                    "draft", f"forward {i + 1} all-reduce (embedding + 2/layer)", "allreduce",
                    1 + 2 * draft.num_layers, h_bytes, backend))
                rows = batch if draft.proposal == "autoregressive" else batch * k
                per_rank = rows * TOP_TOKEN_BYTES_PER_ROW_PER_RANK
                terms.append(self._collective(
                    "draft", f"forward {i + 1} top-token gather", "allgather", 1,
                    per_rank * tp, "nccl", per_rank_bytes=per_rank))
        return terms

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

    def draft_memory_bytes(self, draft: DraftProfile, placement: str, vocab: str) -> float:
        tp = self.tp if placement == "tp8" else 1
        m = self.model
        parts, once, _ = self._draft_parts(draft, tp, vocab, 1)
        total = sum(p[0] for p in parts.values()) + sum(once.values())
        if "routed experts (INT4)" in parts:  # resident: every expert, not the touched ones
            total -= parts["routed experts (INT4)"][0]
            total += (draft.num_layers * m.n_routed_experts * m.expert_params() / tp
                      * m.routed_expert_bits_per_weight / 8)
        if draft.architecture.get("uses_target_lm_head") and vocab == "full" and tp > 1:
            total -= parts["lm_head"][0]  # shares the target's resident head
        if tp == 1:  # needs its own full embedding table (the target's is vocab-parallel)
            total += m.lm_head_params() * m.dtype_bytes
        return total

    def memory_gb(self, plan: Plan) -> float:
        total = self.target_memory_bytes()
        total += plan.batch * (plan.context + plan.k + 1) * self.kv_bytes_per_token()
        if plan.speculative:
            total += self.draft_memory_bytes(plan.draft, plan.placement, plan.vocab)
            _, _, kv_tok = self._draft_parts(
                plan.draft, self.tp if plan.placement == "tp8" else 1, plan.vocab, 1)
            total += plan.batch * plan.context * kv_tok
        return total / 1e9 + self.hw.reserved_memory_GB

    # -- acceptance ------------------------------------------------------------------------
    def effective_acceptance(self, plan: Plan, acceptance: Acceptance) -> Acceptance:
        if plan.vocab == "reduced" and self.draft_vocab(plan.draft, "reduced") < \
                plan.draft.vocab_size:
            return acceptance.scaled(self.model.reduced_vocab_coverage,
                                     "reduced-vocab coverage")
        return acceptance

    # -- the step ------------------------------------------------------------------------------
    def estimate(self, plan: Plan, acceptance: Acceptance | None = None) -> StepEstimate:
        """Cost of one decode step of ``plan``; ``acceptance`` is needed when ``k > 0``."""
        if plan.backend not in self.latency.backends:
            raise KeyError(f"backend {plan.backend!r} unknown on {self.hw.name}; "
                           f"valid: {', '.join(self.backends)}")
        b = plan.batch
        if not plan.speculative:
            terms = self.target_pass(b, b, plan.context, plan.backend)
            terms += self.verification(b, "gather", plan.backend)
            tau, source = 1.0, "no speculation"
        else:
            if acceptance is None:
                raise ValueError("k > 0 needs an acceptance model")
            if plan.k > plan.draft.max_k:
                raise ValueError(f"{plan.draft.name} proposes at most {plan.draft.max_k} tokens")
            n = b * (plan.k + 1)
            terms = self.target_pass(n, b, plan.context, plan.backend)
            terms += self.verification(n, plan.verifier, plan.backend)
            terms += self.draft_step(plan.draft, plan.k, b, plan.context, plan.placement,
                                     plan.vocab, plan.backend)
            acc = self.effective_acceptance(plan, acceptance)
            tau, source = acc.tau(plan.k), acc.source
            terms.append(Term("overhead", "speculation bookkeeping",
                              time_s=self.hw.spec_step_overhead_us * 1e-6))
        if self.count_mode == "profile":
            extra = int(self.model.collectives.get("unattributed_allreduce_per_step", 0))
            terms.append(self._collective("overhead", "unattributed all-reduce (profile)",
                                          "allreduce", extra, UNATTRIBUTED_ALLREDUCE_BYTES,
                                          plan.backend))
        terms.append(Term("overhead", "per-step host overhead",
                          time_s=self.hw.step_overhead_us * 1e-6))
        terms = [t for t in terms if t.time_s or t.hbm_bytes or t.collectives]
        budget = self.hw.memory_capacity_GB * self.hw.gpu_memory_utilization
        return StepEstimate(plan, tuple(terms), tau, self.memory_gb(plan), budget, source)

    def no_spec(self, batch: int = 1, context: int = 1024,
                backend: str = "nccl") -> StepEstimate:
        return self.estimate(Plan(k=0, backend=backend, batch=batch, context=context))


def _logits_collectives(model: ModelProfile) -> int:
    """Logits collectives per verification (1 in vLLM's layout)."""
    return int(model.collectives.get("logits_allgather", 1))


def prior_params(hw: HardwareProfile) -> CalibParams:
    pr = hw.calibration.get("priors", {})
    return CalibParams(
        bandwidth_efficiency=float(pr.get("bandwidth_efficiency", 0.7)),
        collective_overhead_us=float(pr.get("collective_overhead_us", 0.0)),
        calibrated=False,
        note=f"priors of {hw.name} (no published figure fitted)",
    )

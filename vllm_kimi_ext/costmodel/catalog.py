"""Catalog of the cost model's data files: model, hardware, draft and latency profiles.

Profiles are JSON files shipped as package data under ``costmodel/profiles/``:

- ``models/<name>.json``     target architecture (dimensions, quantisation, counts)
- ``hardware/<name>.json``   one box: bandwidth, capacity, backends, published figures
- ``latency/<name>.json``    collective latency tables per backend (see :mod:`.latency`)
- ``drafts/<name>.json``     public drafts: architecture, placement options, acceptance

Names are the file stems. ``load_*`` also accept a path to a JSON file so that a
measured profile can be tried without editing the package.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any

KINDS = ("models", "hardware", "latency", "drafts")


class UnknownProfileError(KeyError, ValueError):
    """Raised for a profile name that is not shipped; the message lists the valid ones."""

    def __init__(self, kind: str, name: str, valid: list[str]):
        self.kind = kind
        self.name = name
        self.valid = valid
        singular = {"models": "model", "hardware": "hardware", "latency": "latency table",
                    "drafts": "draft"}[kind]
        super().__init__(
            f"unknown {singular} profile {name!r}; valid: {', '.join(valid) or '(none)'}"
        )

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


def _profile_dir(kind: str):
    return resources.files("vllm_kimi_ext.costmodel").joinpath("profiles", kind)


def list_profiles(kind: str) -> list[str]:
    """Names of the shipped profiles of one kind, sorted."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    folder = _profile_dir(kind)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_raw(kind: str, name_or_path: str | Path) -> dict[str, Any]:
    """The parsed JSON of a profile given its name or a path to a JSON file."""
    text = str(name_or_path)
    if text.endswith(".json") and Path(text).is_file():
        return json.loads(Path(text).read_text())
    valid = list_profiles(kind)
    if text not in valid:
        raise UnknownProfileError(kind, text, valid)
    return json.loads(_profile_dir(kind).joinpath(text + ".json").read_text())


# ---------------------------------------------------------------------------------------------
# Target model
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    name: str
    hidden_size: int
    num_layers: int
    first_k_dense_replace: int
    dense_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    moe_intermediate_size: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    vocab_size: int
    dtype_bytes: float
    kv_cache_dtype_bytes: float
    routed_expert_bits_per_weight: float
    router_dtype_bytes: float
    routing_skew: float
    kernels: dict[str, float]
    collectives: dict[str, Any]
    reduced_draft_vocab_size: int
    reduced_vocab_coverage: float
    raw: dict[str, Any] = dataclasses.field(repr=False, compare=False, default_factory=dict)

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense_replace

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_latent_dim(self) -> int:
        """Elements cached per token per layer by MLA (latent + rope key)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    # -- parameter counts (elements) ----------------------------------------------------------
    def mla_params(self, input_size: int | None = None) -> tuple[float, float]:
        """(replicated, tensor-parallel) parameters of one MLA attention block."""
        h_in = input_size or self.hidden_size
        n_h = self.num_attention_heads
        replicated = h_in * (self.q_lora_rank + self.kv_latent_dim)  # fused_qkv_a_proj
        sharded = (
            self.q_lora_rank * n_h * self.qk_head_dim  # q_b_proj
            + self.kv_lora_rank * n_h * (self.qk_nope_head_dim + self.v_head_dim)  # kv_b_proj
            + n_h * self.v_head_dim * self.hidden_size  # o_proj
        )
        return float(replicated), float(sharded)

    def expert_params(self) -> float:
        return 3.0 * self.hidden_size * self.moe_intermediate_size

    def router_params(self) -> float:
        return float(self.hidden_size * self.n_routed_experts)

    def dense_mlp_params(self) -> float:
        return 3.0 * self.hidden_size * self.dense_intermediate_size

    def lm_head_params(self, vocab: int | None = None) -> float:
        return float((vocab or self.vocab_size) * self.hidden_size)

    def expected_distinct_experts(self, n_tokens: float, skew: float | None = None) -> float:
        """E[distinct routed experts touched by ``n_tokens`` tokens] under top-k routing.

        Uniform independent routing gives ``E * (1 - (1 - k/E)^n)``. A skew factor ``s >= 1``
        treats the tokens as ``1 + (n - 1) / s`` independent ones, so one token always touches
        exactly ``k`` experts and the count never exceeds ``E``.
        """
        if n_tokens <= 0:
            return 0.0
        s = self.routing_skew if skew is None else skew
        if s <= 0:
            raise ValueError("routing skew must be positive")
        n_eff = 1.0 + (n_tokens - 1.0) / s
        e, k = self.n_routed_experts, self.num_experts_per_tok
        return e * (1.0 - (1.0 - k / e) ** n_eff)

    def total_params(self) -> float:
        """All parameters of the text stack (for the published ~1.04T sanity check)."""
        rep, shd = self.mla_params()
        attn = self.num_layers * (rep + shd)
        moe = self.num_moe_layers * (
            self.n_routed_experts * self.expert_params()
            + self.n_shared_experts * self.expert_params()
            + self.router_params()
        )
        dense = self.first_k_dense_replace * self.dense_mlp_params()
        return attn + moe + dense + 2 * self.lm_head_params()

    def active_params(self) -> float:
        """Parameters touched by one token (for the published ~32B sanity check)."""
        rep, shd = self.mla_params()
        attn = self.num_layers * (rep + shd)
        moe = self.num_moe_layers * (
            (self.num_experts_per_tok + self.n_shared_experts) * self.expert_params()
            + self.router_params()
        )
        dense = self.first_k_dense_replace * self.dense_mlp_params()
        return attn + moe + dense + 2 * self.lm_head_params()


def load_model(name_or_path: str | Path = "kimi-k2.5") -> ModelProfile:
    d = load_raw("models", name_or_path)
    fields = {f.name for f in dataclasses.fields(ModelProfile)} - {"raw"}
    missing = sorted(fields - d.keys())
    if missing:
        raise ValueError(f"model profile {d.get('name')!r} lacks {missing}")
    return ModelProfile(**{k: d[k] for k in fields}, raw=d)


# ---------------------------------------------------------------------------------------------
# Hardware
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PublishedFigure:
    id: str
    engine: str
    backend: str
    tokens_per_s: float
    source: str
    allreduce_share: float | None = None
    allreduce_calls_per_step: int | None = None
    allreduce_call_us: float | None = None

    @property
    def step_s(self) -> float:
        return 1.0 / self.tokens_per_s


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    tp: int
    memory_bandwidth_GBps: float
    memory_capacity_GB: float
    gpu_memory_utilization: float
    reserved_memory_GB: float
    peak_bf16_tflops: float
    compute_efficiency: float
    kernel_gap_us: float
    step_overhead_us: float
    spec_step_overhead_us: float
    latency_table: str
    backends: dict[str, dict[str, Any]]
    calibration: dict[str, Any]
    assumptions: tuple[str, ...] = ()
    raw: dict[str, Any] = dataclasses.field(repr=False, compare=False, default_factory=dict)

    @property
    def published(self) -> list[PublishedFigure]:
        return [PublishedFigure(**p) for p in self.calibration.get("published", [])]

    @property
    def calibration_context(self) -> int:
        return int(self.calibration.get("context_tokens", 1024))

    def backend_is_stock(self, backend: str) -> bool:
        return bool(self.backends.get(backend, {}).get("stock", False))

    def with_overrides(self, **changes: Any) -> HardwareProfile:
        """A copy with some fields replaced (what-if studies and tests)."""
        return dataclasses.replace(self, **changes)


def load_hardware(name_or_path: str | Path) -> HardwareProfile:
    d = load_raw("hardware", name_or_path)
    fields = {f.name for f in dataclasses.fields(HardwareProfile)} - {"raw", "assumptions"}
    missing = sorted(fields - d.keys())
    if missing:
        raise ValueError(f"hardware profile {d.get('name')!r} lacks {missing}")
    return HardwareProfile(
        **{k: d[k] for k in fields}, assumptions=tuple(d.get("assumptions", ())), raw=d
    )


# ---------------------------------------------------------------------------------------------
# Drafts
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DraftProfile:
    name: str
    checkpoint: str
    kind: str  # eagle3 | eagle3_mla | mtp | dflash
    description: str
    proposal: str  # autoregressive (k forwards per step) | one_pass (1 forward per step)
    max_k: int
    architecture: dict[str, Any]
    acceptance: dict[str, Any] | None
    assumptions: tuple[str, ...] = ()
    stock_supported: bool = True
    stock_note: str = ""
    raw: dict[str, Any] = dataclasses.field(repr=False, compare=False, default_factory=dict)

    @property
    def num_layers(self) -> int:
        return int(self.architecture.get("num_layers", 1))

    @property
    def vocab_size(self) -> int:
        return int(self.architecture["vocab_size"])

    def datasets(self) -> list[str]:
        return sorted((self.acceptance or {}).get("values", {}))


def load_draft(name_or_path: str | Path) -> DraftProfile:
    d = load_raw("drafts", name_or_path)
    if d.get("kind") not in ("eagle3", "eagle3_mla", "mtp", "dflash"):
        raise ValueError(f"draft {d.get('name')!r}: unknown kind {d.get('kind')!r}")
    if d.get("proposal") not in ("autoregressive", "one_pass"):
        raise ValueError(f"draft {d.get('name')!r}: unknown proposal {d.get('proposal')!r}")
    return DraftProfile(
        name=d["name"],
        checkpoint=d.get("checkpoint", ""),
        kind=d["kind"],
        description=d.get("description", ""),
        proposal=d["proposal"],
        max_k=int(d.get("max_k", 7)),
        architecture=d["architecture"],
        acceptance=d.get("acceptance"),
        assumptions=tuple(d.get("assumptions", ())),
        stock_supported=bool(d.get("stock_supported", True)),
        stock_note=d.get("stock_note", ""),
        raw=d,
    )

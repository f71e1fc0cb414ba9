"""Catalog of the cost model's data files: model, hardware, draft and latency profiles.

Profiles are JSON files shipped as package data under ``costmodel/profiles/``:

- ``models/<name>.json``     target architecture (dimensions, quantisation, counts)
- ``hardware/<name>.json``   one box: bandwidth, capacity, backends, calibration points
                             with their sources and the fitted parameters
- ``latency/<name>.json``    measured collective latency tables (see :mod:`.latency`)
- ``drafts/<name>.json``     drafts: architecture, placement options, acceptance (the
                             card figure and, where public logs exist, field figures)

Names are the file stems. ``load_*`` also accept a path to a JSON file so that a
measured profile can be tried without editing the package. Every problem with a profile
raises :class:`ProfileError` with one line naming the file, the field and what was expected.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from vllm_kimi_ext import patch_ids
from vllm_kimi_ext.facts import HARDWARE_PROFILE
from vllm_kimi_ext.patchset import PatchSetError
from vllm_kimi_ext.user_input import UserInputError

KINDS = ("models", "hardware", "latency", "drafts")
#: The hardware profile the project is for (8x RTX PRO 6000, PCIe only): the CLI's default
#: and the box every generated table is priced on.
DEFAULT_HARDWARE = HARDWARE_PROFILE
_SINGULAR = {"models": "model", "hardware": "hardware", "latency": "latency table",
             "drafts": "draft"}


class ProfileError(UserInputError):
    """A profile that cannot be used; the message names the file and the field."""


class UnknownProfileError(KeyError, UserInputError):
    """Raised for a profile name that is not shipped; the message lists the valid ones."""

    def __init__(self, kind: str, name: str, valid: list[str]):
        self.kind = kind
        self.name = name
        self.valid = valid
        super().__init__(
            f"unknown {_SINGULAR[kind]} profile {name!r}; valid: {', '.join(valid) or '(none)'}"
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


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                           f"{exc.msg})") from None
    if not isinstance(doc, dict):
        raise ProfileError(f"{where}: expected a JSON object at the top level, "
                           f"got {type(doc).__name__}")
    return doc


def load_raw(kind: str, name_or_path: str | Path, with_location: bool = False):
    """The parsed JSON of a profile given its name or a path to a JSON file (and, with
    ``with_location``, the file name used in error messages)."""
    text = str(name_or_path)
    if text.endswith(".json") or "/" in text or "\\" in text:
        path = Path(text)
        if not path.is_file():
            raise ProfileError(f"{path}: no such {_SINGULAR[kind]} profile file")
        try:
            raw = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ProfileError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
        where = str(path)
    else:
        valid = list_profiles(kind)
        if text not in valid:
            raise UnknownProfileError(kind, text, valid)
        where = f"profiles/{kind}/{text}.json"
        raw = _profile_dir(kind).joinpath(text + ".json").read_text(encoding="utf-8")
    doc = _render_patch_refs(_parse(raw, where), where)
    return (doc, where) if with_location else doc


def _render_patch_refs(value: Any, where: str, field: str = "") -> Any:
    """``value`` with the ``{patch:SLUG}`` placeholders of its strings rendered as patch
    numbers of the shipped series (:func:`vllm_kimi_ext.patch_ids.render`)."""
    if isinstance(value, dict):
        return {k: _render_patch_refs(v, where, f"{field}.{k}" if field else k)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_render_patch_refs(v, where, f"{field}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str) and "{patch:" in value:
        try:
            return patch_ids.render(value)
        except PatchSetError as exc:
            raise ProfileError(f"{where}: field {field!r}: {exc}") from None
    return value


def require(doc: dict[str, Any], field: str, kind: type | tuple, where: str,
            expected: str | None = None, positive: bool = False) -> Any:
    """``doc[field]`` checked against ``kind`` (and > 0 with ``positive``), else ProfileError."""
    if field not in doc:
        raise ProfileError(f"{where}: field {field!r} is missing"
                           + (f" (expected {expected})" if expected else ""))
    v = doc[field]
    numeric = kind in (int, float) or kind == (int, float)
    ok = isinstance(v, kind) and not (numeric and isinstance(v, bool))
    if ok and numeric:
        ok = math.isfinite(float(v)) and (not positive or v > 0)
    if not ok:
        want = expected or (("a positive " if positive else "a ") + (
            "number" if numeric else getattr(kind, "__name__", str(kind))))
        raise ProfileError(f"{where}: field {field!r} must be {want}, got {v!r}")
    return v


# ---------------------------------------------------------------------------------------------
# Target model
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def expert_probabilities(n_experts: int, top_k: int, popularity: float) -> tuple[float, ...]:
    """Probability that one token routes to each expert, Zipf-shaped: weights
    ``(rank + 1)^-popularity`` scaled to sum to ``top_k`` (each token picks ``top_k``
    experts), none above 1. ``popularity`` 0 is uniform routing."""
    if popularity < 0:
        raise ValueError("popularity must be >= 0")
    w = [(i + 1) ** -popularity for i in range(n_experts)]
    p = [0.0] * n_experts
    fixed, budget = set(), float(top_k)
    while True:  # water-filling: cap at 1 and spread the rest over the others
        free = sum(w[i] for i in range(n_experts) if i not in fixed)
        capped = False
        for i in range(n_experts):
            if i not in fixed:
                p[i] = budget * w[i] / free
                if p[i] > 1.0:
                    fixed.add(i)
                    capped = True
        if not capped:
            break
        for i in fixed:
            p[i] = 1.0
        budget = top_k - len(fixed)
    return tuple(p)


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

    def expected_distinct_experts(self, n_tokens: float, skew: float | None = None,
                                  popularity: float = 0.0, batch: float | None = None) -> float:
        """E[distinct routed experts touched by ``n_tokens`` tokens] under top-k routing.

        ``batch`` sequences contribute ``n_tokens / batch`` tokens each (default: one
        sequence). The tokens of one sequence verified in the same pass are correlated: a
        skew ``s >= 1`` counts them as ``1 + (q - 1) / s`` independent tokens (``skew``
        defaults to the profile's prior). Independent tokens pick experts with
        probabilities ``p_e`` (:func:`expert_probabilities`; uniform ``k/E`` at
        ``popularity`` 0), so ``E[d] = sum_e 1 - (1 - p_e)^n_eff``: one token touches
        exactly ``k`` experts and the count never exceeds ``E``.
        """
        if n_tokens <= 0:
            return 0.0
        s = self.routing_skew if skew is None else skew
        if s <= 0:
            raise ValueError("routing skew must be positive")
        seqs = 1.0 if batch is None else max(float(batch), 1.0)
        q = max(n_tokens / seqs, 1.0)
        n_eff = seqs * (1.0 + (q - 1.0) / s)
        e, k = self.n_routed_experts, self.num_experts_per_tok
        if popularity == 0.0:
            return e * (1.0 - (1.0 - k / e) ** n_eff)
        return sum(1.0 - (1.0 - p) ** n_eff for p in expert_probabilities(e, k, popularity))

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


_MODEL_NUMERIC = ("hidden_size", "num_layers", "first_k_dense_replace", "dense_intermediate_size",
                  "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
                  "moe_intermediate_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
                  "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "vocab_size",
                  "dtype_bytes", "kv_cache_dtype_bytes", "routed_expert_bits_per_weight",
                  "router_dtype_bytes", "routing_skew", "reduced_draft_vocab_size",
                  "reduced_vocab_coverage")


def load_model(name_or_path: str | Path = "kimi-k2.5") -> ModelProfile:
    d, where = load_raw("models", name_or_path, with_location=True)
    for f in _MODEL_NUMERIC:
        require(d, f, (int, float), where, positive=f != "first_k_dense_replace")
    require(d, "kernels", dict, where, "an object of kernel counts")
    require(d, "collectives", dict, where, "an object of collective counts")
    for f in ("moe_layer", "dense_layer", "per_pass", "sampler"):
        require(d["kernels"], f, (int, float), f"{where}: field 'kernels'")
    for f in ("allreduce_per_layer", "embedding_allreduce"):
        require(d["collectives"], f, int, f"{where}: field 'collectives'")
    if d["reduced_vocab_coverage"] > 1:
        raise ProfileError(f"{where}: field 'reduced_vocab_coverage' must be within (0, 1], "
                           f"got {d['reduced_vocab_coverage']!r}")
    fields = {f.name for f in dataclasses.fields(ModelProfile)} - {"raw"}
    return ModelProfile(**{k: d[k] for k in fields if k in d}, raw=d)


# ---------------------------------------------------------------------------------------------
# Hardware
# ---------------------------------------------------------------------------------------------


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
    where: str = dataclasses.field(default="", compare=False)  # the file, for error lines

    def with_overrides(self, **changes: Any) -> HardwareProfile:
        """A copy with some fields replaced (what-if studies and tests)."""
        return dataclasses.replace(self, **changes)


_HW_NUMERIC = ("tp", "memory_bandwidth_GBps", "memory_capacity_GB", "gpu_memory_utilization",
               "reserved_memory_GB", "peak_bf16_tflops", "compute_efficiency", "kernel_gap_us",
               "step_overhead_us", "spec_step_overhead_us")


def load_hardware(name_or_path: str | Path) -> HardwareProfile:
    d, where = load_raw("hardware", name_or_path, with_location=True)
    require(d, "name", str, where)
    for f in _HW_NUMERIC:
        require(d, f, (int, float), where,
                positive=f not in ("kernel_gap_us", "step_overhead_us", "spec_step_overhead_us",
                                   "reserved_memory_GB"))
    require(d, "latency_table", str, where, "a latency profile name or JSON path")
    require(d, "backends", dict, where, "an object of all-reduce backends")
    if "nccl" not in d["backends"]:
        raise ProfileError(f"{where}: field 'backends' must include 'nccl'")
    require(d, "calibration", dict, where, "an object")
    fields = {f.name for f in dataclasses.fields(HardwareProfile)} - {"raw", "assumptions",
                                                                       "description", "where"}
    return HardwareProfile(**{k: d[k] for k in fields if k in d},
                           description=d.get("description", ""),
                           assumptions=tuple(d.get("assumptions", ())), raw=d, where=where)


# ---------------------------------------------------------------------------------------------
# Drafts
# ---------------------------------------------------------------------------------------------

DRAFT_KINDS = ("eagle3", "eagle3_mla", "mtp", "dflash", "dspark", "draft_model")
PROPOSALS = ("autoregressive", "one_pass")


@dataclasses.dataclass(frozen=True)
class DraftProfile:
    name: str
    checkpoint: str
    kind: str  # see DRAFT_KINDS
    description: str
    proposal: str  # autoregressive (k forwards per step) | one_pass (1 forward per step)
    max_k: int
    architecture: dict[str, Any]
    acceptance: dict[str, Any] | None
    assumptions: tuple[str, ...] = ()
    stock_supported: bool = True
    stock_note: str = ""
    method: str = ""  # vLLM's speculative "method"
    placements: tuple[str, ...] = ()  # () = every placement the model knows
    project_requires: str = ""  # project feature needed to load it at all ("" = none)
    raw: dict[str, Any] = dataclasses.field(repr=False, compare=False, default_factory=dict)

    @property
    def num_layers(self) -> int:
        return int(self.architecture.get("num_layers", 1))

    @property
    def vocab_size(self) -> int:
        return int(self.architecture["vocab_size"])

    def datasets(self) -> list[str]:
        return sorted((self.acceptance or {}).get("values", {}))

    def field_figures(self) -> list[dict[str, Any]]:
        """Acceptance measured in public runs (``acceptance.field``), with sources."""
        return list((self.acceptance or {}).get("field", []))


_DEFAULT_METHOD = {"eagle3": "eagle3", "eagle3_mla": "eagle3", "mtp": "mtp", "dflash": "dflash",
                   "dspark": "dspark", "draft_model": "draft_model"}


def load_draft(name_or_path: str | Path) -> DraftProfile:
    d, where = load_raw("drafts", name_or_path, with_location=True)
    require(d, "name", str, where)
    if d.get("kind") not in DRAFT_KINDS:
        raise ProfileError(f"{where}: field 'kind' must be one of {', '.join(DRAFT_KINDS)}, "
                           f"got {d.get('kind')!r}")
    if d.get("proposal") not in PROPOSALS:
        raise ProfileError(f"{where}: field 'proposal' must be one of {', '.join(PROPOSALS)}, "
                           f"got {d.get('proposal')!r}")
    arch = require(d, "architecture", dict, where, "an object")
    require(arch, "vocab_size", int, f"{where}: field 'architecture'", positive=True)
    acc = d.get("acceptance")
    if acc is not None and not isinstance(acc, dict):
        raise ProfileError(f"{where}: field 'acceptance' must be an object or null")
    max_k = d.get("max_k", 7)
    if not isinstance(max_k, int) or isinstance(max_k, bool) or not 1 <= max_k <= 15:
        raise ProfileError(f"{where}: field 'max_k' must be an integer within 1..15, got {max_k!r}")
    return DraftProfile(
        name=d["name"], checkpoint=d.get("checkpoint", ""), kind=d["kind"],
        description=d.get("description", ""), proposal=d["proposal"], max_k=max_k,
        architecture=arch, acceptance=acc, assumptions=tuple(d.get("assumptions", ())),
        stock_supported=bool(d.get("stock_supported", True)),
        stock_note=d.get("stock_note", ""), method=d.get("method", _DEFAULT_METHOD[d["kind"]]),
        placements=tuple(d.get("placements", ())),
        project_requires=d.get("project_requires", ""), raw=d)

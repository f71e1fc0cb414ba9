"""Facts about Kimi-K2.5 and its public drafts, read from the cost model's profiles.

The JSON profiles shipped under ``vllm_kimi_ext/costmodel/profiles/`` are the one
place where the target's dimensions (``models/kimi-k2.5.json``) and the drafts'
published acceptance numbers (``drafts/<name>.json``) are written down, with their
sources.  Code that needs one of them reads it here instead of repeating the
number, so a corrected profile corrects every table and message at once.

Standard library only (the profiles are package data); a missing or malformed
field raises :class:`FactsError` naming the file, the field and what was expected.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any

__all__ = [
    "TARGET_PROFILE",
    "FactsError",
    "PublishedAcceptance",
    "DraftShape",
    "TargetDims",
    "SpecialTokens",
    "draft_num_layers",
    "draft_shape",
    "special_tokens",
    "published_acceptance",
    "target_dims",
]

#: the served target's model profile
TARGET_PROFILE = "kimi-k2.5"
#: the deployment's hardware profile (8x RTX PRO 6000, PCIe only): the default of every
#: command that prices something (``plan``, ``draft bill``)
HARDWARE_PROFILE = "rtx-pro-6000-pcie-x8"


class FactsError(ValueError):
    """A profile is missing, unreadable, or lacks a field this module reads."""


@functools.cache
def _profile(kind: str, name: str) -> tuple[str, dict[str, Any]]:
    """``(shown path, parsed JSON)`` of ``costmodel/profiles/<kind>/<name>.json``."""
    shown = f"vllm_kimi_ext/costmodel/profiles/{kind}/{name}.json"
    path = resources.files("vllm_kimi_ext").joinpath("costmodel", "profiles", kind, name + ".json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FactsError(f"{shown}: cannot read profile ({exc})") from exc
    if not isinstance(data, dict):
        raise FactsError(f"{shown}: expected a JSON object at top level")
    return shown, data


def _checked(shown: str, dotted: str, value: Any, expected: type) -> Any:
    if expected is float:
        ok = isinstance(value, (int, float))
    else:
        ok = isinstance(value, expected)
    if not ok or isinstance(value, bool):
        raise FactsError(f"{shown}: field {dotted!r} is {value!r} (expected {expected.__name__})")
    return value


def _field(kind: str, name: str, dotted: str, expected: type) -> Any:
    """The value at ``dotted`` (``a.b.c``) of a profile, checked to be ``expected``."""
    shown, node = _profile(kind, name)
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise FactsError(f"{shown}: field {dotted!r} missing (expected {expected.__name__})")
        node = node[part]
    return _checked(shown, dotted, node, expected)


@dataclass(frozen=True)
class TargetDims:
    """The target's shape, and the collectives one tensor-parallel pass makes."""

    name: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_attention_heads: int
    allreduces_per_layer: int  # MLA o_proj + MoE/MLP
    embedding_allreduces: int  # vocab-parallel embedding
    logits_allgathers: int
    active_params: float  # parameters active per token, as the model card states them

    @property
    def allreduces_per_pass(self) -> int:
        """All-reduces of one target forward at TP > 1 (123 for 61 layers)."""
        return self.num_layers * self.allreduces_per_layer + self.embedding_allreduces


@functools.cache
def target_dims(name: str = TARGET_PROFILE) -> TargetDims:
    """Dimensions of a target model profile (default: Kimi-K2.5)."""

    def get(field: str) -> int:
        return _field("models", name, field, int)

    return TargetDims(
        name=name,
        hidden_size=get("hidden_size"),
        num_layers=get("num_layers"),
        vocab_size=get("vocab_size"),
        num_attention_heads=get("num_attention_heads"),
        allreduces_per_layer=get("collectives.allreduce_per_layer"),
        embedding_allreduces=get("collectives.embedding_allreduce"),
        logits_allgathers=get("collectives.logits_allgather"),
        active_params=float(_field("models", name, "active_params", float)),
    )


@dataclass(frozen=True)
class PublishedAcceptance:
    """A draft's published mean acceptance lengths (tokens per step, bonus included)."""

    draft: str  # profile name
    checkpoint: str
    k: int  # draft tokens per step the numbers were measured at
    lengths: Mapping[str, float]  # dataset key (e.g. "mt-bench") -> acceptance length
    source: str


@functools.cache
def published_acceptance(draft: str) -> PublishedAcceptance:
    """The acceptance lengths a draft profile quotes, e.g. ``lightseek-eagle3``."""
    shown, _ = _profile("drafts", draft)
    metric = _field("drafts", draft, "acceptance.metric", str)
    if metric != "acceptance_length":
        raise FactsError(f"{shown}: field 'acceptance.metric' is {metric!r} "
                         "(expected 'acceptance_length')")
    values = _field("drafts", draft, "acceptance.values", dict)
    lengths = {dataset: float(_checked(shown, f"acceptance.values.{dataset}", value, float))
               for dataset, value in values.items()}
    return PublishedAcceptance(
        draft=draft,
        checkpoint=_field("drafts", draft, "checkpoint", str),
        k=_field("drafts", draft, "acceptance.k_ref", int),
        lengths=MappingProxyType(lengths),
        source=_field("drafts", draft, "acceptance.source", str),
    )


def draft_num_layers(draft: str) -> int:
    """Decoder layers of a draft profile's architecture (drives its collective count)."""
    return _field("drafts", draft, "architecture.num_layers", int)


@dataclass(frozen=True)
class DraftShape:
    """A draft head's shape, from its profile's ``architecture``."""

    draft: str  # profile name
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_aux_hidden_states: int
    vocab_size: int


@functools.cache
def draft_shape(draft: str) -> DraftShape:
    """The shape of a draft profile's head, e.g. ``lightseek-eagle3``."""

    def get(field: str) -> int:
        return _field("drafts", draft, f"architecture.{field}", int)

    return DraftShape(draft, *(get(f.name) for f in dataclasses.fields(DraftShape)[1:]))


@dataclass(frozen=True)
class SpecialTokens:
    """The special tokens Kimi-K2.5's chat format and parsers rely on, by name."""

    bos: str
    eos: str
    chat: tuple[str, ...]

    @property
    def all(self) -> tuple[str, ...]:
        return (self.bos, self.eos, *self.chat)


@functools.cache
def special_tokens(name: str = TARGET_PROFILE) -> SpecialTokens:
    """A target model profile's special tokens (default: Kimi-K2.5)."""
    shown, _ = _profile("models", name)
    chat = _field("models", name, "special_tokens.chat", list)
    for i, token in enumerate(chat):
        _checked(shown, f"special_tokens.chat[{i}]", token, str)
    return SpecialTokens(bos=_field("models", name, "special_tokens.bos", str),
                         eos=_field("models", name, "special_tokens.eos", str),
                         chat=tuple(chat))

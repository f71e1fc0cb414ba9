"""``method: "kimi_tli"`` -- a draft model with another tokenizer, lossless (vLLM side).

Registered by the plugin through vLLM's own custom-speculator API
(``register_speculative_method``), as a subclass of vLLM's ``draft_model``
configuration: everything vLLM does for a standalone draft model (loading,
KV cache, CUDA graphs, the expanded prefill, multi-step decode) is reused; the
speculator (:mod:`vllm_kimi_ext.integration.tli_speculator`) only changes the two
places where ids cross between the vocabularies.

Usage::

    VLLM_KIMI_EXT=1 vllm serve moonshotai/Kimi-K2.5 --tensor-parallel-size 8 \\
        --speculative-config '{"method": "kimi_tli", "model": "/models/small-draft",
                               "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1,
                               "speculator_options": {"draft_tokenizer": "/models/small-draft"}}'

(``draft_tensor_parallel_size: 1``: the whole dense draft on every rank, no
collectives while drafting; the draft-TP-1 patches, ``patch_ids.DRAFT_MODEL_TP1``.)

``speculator_options`` (all optional):

* ``draft_tokenizer`` -- the draft's tokenizer directory (default: ``model``).
  vLLM itself gives the draft the *target's* tokenizer; this one is only read to
  build the vocabulary maps.
* ``target_tokenizer`` -- the target's tokenizer directory (default: the
  target's ``tokenizer``).
* ``min_shared_tokens`` -- refuse a draft sharing fewer tokens (default 1).

Refused at configuration time, before anything loads, with the reason: a
tokenizer directory that is not local or has no readable tokenizer, a tokenizer
with ids beyond its model's vocab size, too small an intersection,
``use_local_argmax_reduction`` (it returns draft ids, bypassing the map),
unknown options.  vLLM's ``draft_model`` vocab-size equality check is replaced
by these: sizes may differ, meanings are matched token by token.

This module must stay importable in every vLLM process without importing the
speculator (vLLM's rule for speculator config modules).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from vllm.v1.worker.gpu.spec_decode.standalone_ar.config import StandaloneARSpeculatorConfig

from vllm_kimi_ext.checkpoints.local_dir import local_dir
from vllm_kimi_ext.drafts.tli.maps import TLIConfigError, TLIMaps, build_tli_maps
from vllm_kimi_ext.tokenizers.loading import tokenizer_kind

logger = logging.getLogger("vllm_kimi_ext")

TLI_METHOD = "kimi_tli"
OPTIONS = frozenset({"draft_tokenizer", "target_tokenizer", "min_shared_tokens"})


def _local_tokenizer_dir(name: Any, role: str, option: str) -> Path:
    path = local_dir(str(name)) if name else None
    if path is None:
        raise TLIConfigError(
            f"{TLI_METHOD}: the {role} tokenizer {name!r} is not a local directory (or a "
            f"cached hub snapshot); set speculator_options.{option} to one")
    if tokenizer_kind(path) is None:
        raise TLIConfigError(
            f"{TLI_METHOD}: {role} tokenizer directory {path} has neither a Kimi-format "
            f"tiktoken.model nor a tokenizer.json; set speculator_options.{option}")
    return path


def resolve_tli(spec) -> tuple[Path, Path, int]:
    """(target tokenizer dir, draft tokenizer dir, min_shared_tokens) of a spec config."""
    opts = dict(getattr(spec, "speculator_options", None) or {})
    unknown = sorted(set(opts) - OPTIONS)
    if unknown:
        raise TLIConfigError(
            f"{TLI_METHOD}: unknown speculator_options {unknown}; known: {sorted(OPTIONS)}")
    target = _local_tokenizer_dir(
        opts.get("target_tokenizer") or spec.target_model_config.tokenizer,
        "target", "target_tokenizer")
    draft = _local_tokenizer_dir(opts.get("draft_tokenizer") or spec.model,
                                 "draft", "draft_tokenizer")
    min_shared = opts.get("min_shared_tokens", 1)
    if not isinstance(min_shared, int) or isinstance(min_shared, bool) or min_shared < 1:
        raise TLIConfigError(
            f"{TLI_METHOD}: speculator_options.min_shared_tokens must be a positive integer, "
            f"got {min_shared!r}")
    return target, draft, min_shared


@functools.lru_cache(maxsize=4)
def _maps_cached(target: str, draft: str, vt: int, vd: int, min_shared: int) -> TLIMaps:
    return build_tli_maps(target, draft, target_vocab_size=vt, draft_vocab_size=vd,
                          min_shared_tokens=min_shared)


def maps_for(spec) -> TLIMaps:
    """The (per-process cached) maps for a configured ``kimi_tli`` spec config."""
    target, draft, min_shared = resolve_tli(spec)
    return _maps_cached(str(target), str(draft), spec.target_model_config.get_vocab_size(),
                        spec.draft_model_config.get_vocab_size(), min_shared)


class TLISpeculatorConfig(StandaloneARSpeculatorConfig):
    """vLLM's ``draft_model`` speculator, with Token-Level-Intersection id maps."""

    speculator_class = "vllm_kimi_ext.integration.tli_speculator.TLISpeculator"
    supported_options = frozenset({"speculator_options"})
    # Sizes may differ; build_tli_maps matches meanings instead.
    draft_has_own_vocab = False

    @classmethod
    def configure(cls, spec) -> None:
        super().configure(spec)
        if spec.draft_model_config is None:
            raise TLIConfigError(f"{TLI_METHOD} needs a draft model (`model`)")
        maps = maps_for(spec)
        logger.info("%s: %s", TLI_METHOD, maps.describe())
        draft_len = getattr(spec.draft_model_config, "max_model_len", None)
        target_len = getattr(spec.target_model_config, "max_model_len", None)
        if draft_len and target_len and draft_len < target_len:
            # as for draft_model: vLLM lowers the served context to the draft's
            logger.warning(
                "%s: the draft %s handles %d positions, fewer than the target's %d; "
                "vLLM serves at most %d tokens per request with this draft",
                TLI_METHOD, spec.draft_model_config.model, draft_len, target_len, draft_len)

    @classmethod
    def apply_options(cls, spec) -> None:
        super().apply_options(spec)
        if getattr(spec, "use_local_argmax_reduction", False):
            raise TLIConfigError(
                f"{TLI_METHOD} is not compatible with use_local_argmax_reduction: the "
                "local argmax returns draft-vocabulary ids and bypasses the intersection")

    def hash_factors(self) -> list[Any]:
        target, draft, min_shared = resolve_tli(self.spec_config)
        return [*super().hash_factors(), TLI_METHOD, str(target), str(draft), min_shared]

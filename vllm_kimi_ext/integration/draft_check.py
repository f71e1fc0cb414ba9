"""Configuration-time draft checks inside vLLM (plugin side).

:func:`check_speculative_config` runs :mod:`~vllm_kimi_ext.drafts.doctor.diagnosis` on a
built ``VllmConfig``: errors raise (nothing is served), warnings are logged.
The seam is ``VllmConfig._limit_max_model_len_to_draft``, which
``VllmConfig.__post_init__`` calls once the speculative config (draft model
config included) exists and *before* vLLM lowers ``max_model_len`` to the
draft's, so the context-cap warning can name the length the user asked for
(the patch: ``vllm_kimi_ext/runtime/vllm_config.py``).
"""

from __future__ import annotations

import logging

from vllm_kimi_ext import envs
from vllm_kimi_ext.checkpoints.local_dir import local_dir

logger = logging.getLogger("vllm_kimi_ext")

CHECKED_METHODS = ("eagle3", "dflash", "mtp")


def _check_draft_tokenizer(model_config, draft_model_config) -> None:
    """``draft_model`` drafts: refuse a tokenizer that would change what the
    target's ids mean (vLLM 0.34.0 only compares vocab sizes)."""
    from vllm_kimi_ext.tokenizers.compare import refuse_if_incompatible

    target = local_dir(getattr(model_config, "tokenizer", None) or model_config.model)
    draft = local_dir(getattr(draft_model_config, "tokenizer", None)
                       or draft_model_config.model)
    if (target is None or draft is None or not (target / "tiktoken.model").is_file()
            or not (draft / "tiktoken.model").is_file()):
        logger.info("vllm-kimi-ext tokenizer check skipped: no local Kimi-format "
                    "tokenizer (tiktoken.model) in both %s and %s",
                    model_config.model, draft_model_config.model)
        return
    refuse_if_incompatible(target, draft)


def check_speculative_config(vllm_config) -> None:
    """Run the draft checks for ``vllm_config``; raise ``ValueError`` on errors."""
    from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose, raise_on_errors

    spec = getattr(vllm_config, "speculative_config", None)
    model_config = getattr(vllm_config, "model_config", None)
    if spec is None or model_config is None:
        return
    method = spec.method
    if getattr(spec, "custom_method", None) is not None:
        return  # a registered method validates its own draft (kimi_tli: tli_config)
    if method == "draft_model" and spec.draft_model_config is not None:
        _check_draft_tokenizer(model_config, spec.draft_model_config)
        return
    if method not in CHECKED_METHODS or spec.draft_model_config is None:
        return
    target = local_dir(model_config.model)
    draft = local_dir(spec.draft_model_config.model)
    if target is None or draft is None:
        logger.info("vllm-kimi-ext draft check skipped: %s / %s is not a local directory",
                    model_config.model, spec.draft_model_config.model)
        return
    report = diagnose(target, draft, method=method,
                      served_max_model_len=model_config.max_model_len)
    raise_on_errors(report, logger)


def check_unless_skipped(vllm_config) -> None:
    """:func:`check_speculative_config` unless ``VLLM_KIMI_EXT_SKIP_DRAFT_CHECK`` is on."""
    if envs.SKIP_DRAFT_CHECK.get():
        logger.debug("vllm-kimi-ext draft check skipped (%s)", envs.SKIP_DRAFT_CHECK.name)
        return
    check_speculative_config(vllm_config)

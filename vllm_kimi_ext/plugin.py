"""vLLM general plugin entry point (``vllm.general_plugins``: ``kimi_ext``).

vLLM calls :func:`register` in every process it starts (API server, engine
core, each worker), possibly more than once per process, so it is re-entrant:
runtime patches are applied once and a second call only re-checks.

Nothing happens unless ``VLLM_KIMI_EXT=1``: installing the package must not
change vLLM's behaviour. When enabled, the plugin first checks the pin
(:mod:`vllm_kimi_ext.compat`) and refuses — raising, which stops vLLM before
anything is served — on a vLLM other than 0.34.0 or a tree whose applied patch
series differs from this package's. It then registers ``method: "kimi_tli"``
(a draft model with another tokenizer, lossless;
:mod:`vllm_kimi_ext.drafts.tli_config`) and applies the runtime patches.

Environment (read at call time):

* ``VLLM_KIMI_EXT=1`` — enable the plugin.
* ``VLLM_KIMI_EXT_ALLOW_MISMATCH=1`` — downgrade pin refusals to warnings.
* ``VLLM_KIMI_EXT_COUNT_COLLECTIVES=N`` — count collectives per phase in each
  worker and log a per-step summary every N steps (N=1 if set to ``1``/``true``).
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm_kimi_ext")

ENABLE_ENV = "VLLM_KIMI_EXT"
COUNT_ENV = "VLLM_KIMI_EXT_COUNT_COLLECTIVES"

_state: dict[str, object] = {"registered": False}


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "").strip().lower() in ("1", "true", "yes")


def _count_every() -> int:
    raw = os.environ.get(COUNT_ENV, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return 0
    if raw in ("true", "yes"):
        return 1
    try:
        return max(1, int(raw))
    except ValueError as exc:
        raise ValueError(f"{COUNT_ENV} must be an integer step interval, got {raw!r}") from exc


def register_speculative_methods() -> list[str]:
    """Register this project's speculative methods with vLLM's custom-speculator
    API (re-entrant: vLLM accepts the same registration twice)."""
    from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

    from vllm_kimi_ext.drafts.tli_config import TLI_METHOD

    register_speculative_method(
        TLI_METHOD, "vllm_kimi_ext.drafts.tli_config.TLISpeculatorConfig")
    return [TLI_METHOD]


def register() -> None:
    """Entry point vLLM calls; see the module docstring."""
    if not enabled():
        logger.debug("vllm-kimi-ext installed but inactive (set %s=1)", ENABLE_ENV)
        return
    from vllm_kimi_ext.compat import check_compat

    overridden = check_compat()
    for problem in overridden:
        logger.warning("vllm-kimi-ext: continuing despite: %s", problem)
    if _state["registered"]:
        return
    from vllm_kimi_ext import runtime_patches

    register_speculative_methods()
    runtime_patches.apply_all(count_every=_count_every())
    _state["registered"] = True
    logger.info("vllm-kimi-ext active (pid %d)", os.getpid())

"""Runtime patches the plugin applies in each vLLM process (worker side).

Each patch is a small :class:`~vllm_kimi_ext.patching.Patch` class, imported
lazily so that importing this module does not import vLLM's GPU runner.
``apply_all`` is re-entrant (``Patch.apply`` is a no-op when already applied).
"""

from __future__ import annotations

import functools
import logging

from vllm_kimi_ext.comm.accounting import CollectiveCounter, StepReporter, phase
from vllm_kimi_ext.patching import Patch

logger = logging.getLogger("vllm_kimi_ext")

_reporter: StepReporter | None = None
_patch_classes: dict[str, list] = {}


def _collective_patches(count_every: int) -> list[type[Patch]]:
    """Phase labels + a step reporter around the GPU model runner (live counting)."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    global _reporter
    if "collectives" in _patch_classes:  # one set of classes per process
        return _patch_classes["collectives"]
    counter = CollectiveCounter._active or CollectiveCounter().start()
    _reporter = _reporter or StepReporter(counter, every=count_every)

    def _label_draft(runner) -> None:
        spec = getattr(runner, "speculator", None)
        if spec is None or getattr(spec, "_kimi_ext_labelled", False):
            return
        inner = spec.propose

        @functools.wraps(inner)
        def propose(*args, **kwargs):
            with phase("draft"):
                return inner(*args, **kwargs)

        spec.propose = propose
        spec._kimi_ext_labelled = True

    class CountStepsInModelRunner(Patch[GPUModelRunner]):
        def execute_model(self, *args, **kwargs):
            _label_draft(self)
            return CountStepsInModelRunner.original("execute_model")(self, *args, **kwargs)

        def sample_tokens(self, *args, **kwargs):
            try:
                return CountStepsInModelRunner.original("sample_tokens")(self, *args, **kwargs)
            finally:
                _reporter.step_done()

    class LabelVerifyPhase(Patch[RejectionSampler]):
        def __call__(self, *args, **kwargs):
            with phase("verify"):
                return LabelVerifyPhase.original("__call__")(self, *args, **kwargs)

    _patch_classes["collectives"] = [CountStepsInModelRunner, LabelVerifyPhase]
    return _patch_classes["collectives"]


def apply_all(*, count_every: int = 0) -> list[str]:
    """Apply the plugin's runtime patches; returns the names applied now."""
    from vllm_kimi_ext.drafts import hook as draft_hook

    patches: list[type[Patch]] = list(draft_hook.config_check_patches())
    if count_every:
        patches += _collective_patches(count_every)
    from vllm_kimi_ext.drafts import agreement

    if agreement.check_enabled():  # VLLM_KIMI_EXT_CHECK_DRAFT_AGREEMENT=1
        patches.append(agreement.agreement_patch())
    from vllm_kimi_ext.verify import vllm_runner

    if vllm_runner.enabled():
        patches += vllm_runner.patches()
    applied = [p.__name__ for p in patches if p.apply()]
    if applied:
        logger.info("vllm-kimi-ext runtime patches: %s", ", ".join(applied))
    return applied

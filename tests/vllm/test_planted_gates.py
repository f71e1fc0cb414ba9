"""The sharded-verification gate's type checks with vLLM 0.34.0's real classes:
exactly the listed types pass, a subclass does not. vLLM's own
``GPUWatermarkSampler`` subclasses ``Sampler`` and changes how tokens are drawn;
an ``isinstance`` gate would let it through. Instances are made without running
``__init__`` (which needs a GPU) and given the stand-in runner's state."""

from __future__ import annotations

import pytest

from testkit.runner_stand_ins import stand_in_batch, stand_in_runner
from vllm_kimi_ext.integration.sharded_verify import gate
from vllm_kimi_ext.integration.sharded_verify.gate import ineligibility

pytestmark = pytest.mark.vllm

V = 1000
PARAMS = [{"temperature": 0.0}, {"temperature": 1.0, "top_p": 0.95}]


def _real(cls: type, like: object) -> object:
    """An instance of vLLM's ``cls`` carrying the attributes of the stand-in ``like``."""
    obj = object.__new__(cls)
    obj.__dict__.update(vars(like))
    return obj


def _subclass(cls: type) -> type:
    return type(f"My{cls.__name__}", (cls,), {"__module__": "my_plugin"})


def _runner_with_real_sampler(sampler_cls: type):
    runner = stand_in_runner(PARAMS, vocab=V)
    runner.sampler = _real(sampler_cls, runner.sampler)
    return runner


def _sampler_classes():
    from vllm.v1.watermarking.gpu_sampler import GPUWatermarkSampler
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    return Sampler, GPUWatermarkSampler


def test_the_real_sampler_passes():
    sampler, _ = _sampler_classes()
    assert gate.type_name(object.__new__(sampler)) in gate.SAMPLER_TYPES
    assert (ineligibility(_runner_with_real_sampler(sampler), stand_in_batch(2), None, 8, V)
        is None)


def test_vllms_watermark_sampler_a_sampler_subclass_is_refused():
    sampler, watermark = _sampler_classes()
    assert issubclass(watermark, sampler)  # what makes isinstance the wrong test
    assert (ineligibility(_runner_with_real_sampler(watermark), stand_in_batch(2), None, 8, V)
        == "sampler_type")


def test_any_sampler_subclass_is_refused():
    sampler, _ = _sampler_classes()
    runner = _runner_with_real_sampler(_subclass(sampler))
    assert ineligibility(runner, stand_in_batch(2), None, 8, V) == "sampler_type"


def _resolve(qualified: str) -> type:
    import importlib

    module, _, name = qualified.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _runner_with_real_processors(classes):
    runner = _runner_with_real_sampler(_sampler_classes()[0])
    runner.sampler.logits_processors = [object.__new__(c) for c in classes]
    return runner


def test_the_real_built_in_logits_processors_pass():
    real = [_resolve(n) for n in gate.SAFE_LOGITS_PROCESSOR_TYPES]
    assert (ineligibility(_runner_with_real_processors(real), stand_in_batch(2), None, 8, V)
        is None)


@pytest.mark.parametrize("which", range(3), ids=["logit_bias", "penalties", "bad_words"])
def test_a_subclass_of_a_built_in_logits_processor_is_refused(which):
    real = [_resolve(n) for n in gate.SAFE_LOGITS_PROCESSOR_TYPES]
    real[which] = _subclass(real[which])
    assert (ineligibility(_runner_with_real_processors(real), stand_in_batch(2), None, 8, V)
        == "logits_processors")


def test_a_custom_processor_on_vllms_interface_is_refused():
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor

    real = [_resolve(n) for n in gate.SAFE_LOGITS_PROCESSOR_TYPES]
    custom = type("NoRepeat", (LogitsProcessor,), {"__module__": "my_plugin",
                                                   "apply": lambda self, *a, **k: None})
    runner = _runner_with_real_processors(real + [custom])
    assert ineligibility(runner, stand_in_batch(2), None, 8, V) == "logits_processors"


def test_a_rejection_sampler_subclass_is_refused():
    cls = _resolve("vllm.v1.worker.gpu.spec_decode.rejection_sampler.RejectionSampler")
    runner = _runner_with_real_sampler(_sampler_classes()[0])
    runner.rejection_sampler = _real(cls, runner.rejection_sampler)
    assert ineligibility(runner, stand_in_batch(2), None, 8, V) is None
    runner.rejection_sampler = _real(_subclass(cls), runner.rejection_sampler)
    assert ineligibility(runner, stand_in_batch(2), None, 8, V) == "rejection_sampler_type"


def test_a_draft_logits_cache_subclass_is_refused():
    import torch

    cls = _resolve("vllm.v1.worker.gpu.spec_decode.draft_logits.DraftLogitsCache")
    runner = stand_in_runner(PARAMS, vocab=V, draft_logits=torch.zeros(2, 3, V))
    cache = runner.speculator.draft_logits
    runner.speculator.draft_logits = _real(cls, cache)
    assert ineligibility(runner, stand_in_batch(2), None, 8, V) is None
    runner.speculator.draft_logits = _real(_subclass(cls), cache)
    assert ineligibility(runner, stand_in_batch(2), None, 8, V) == "draft_logits_type"

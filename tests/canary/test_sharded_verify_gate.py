"""Canary: every vLLM attribute and object type the sharded-verification gate reads
(``vllm_kimi_ext.integration.sharded_verify.gate.GATE_ATTRIBUTES`` / ``GATE_TYPES``, the lists the
gate itself uses) exists on vLLM 0.34.0's real classes. When one fails after an
upgrade, the gate would send every step to the counted fallback
(``unknown_vllm_state``) at best: revisit the gate and note R07."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re

import pytest

from vllm_kimi_ext.integration.sharded_verify import gate
from vllm_kimi_ext.integration.sharded_verify.gate import GATE_ATTRIBUTES, GATE_TYPES
from vllm_kimi_ext.integration.sharded_verify.sampler import WARM_UP_ATTRIBUTES

pytestmark = [pytest.mark.vllm, pytest.mark.canary]


def resolve(qualified_name: str) -> type:
    module, _, name = qualified_name.rpartition(".")
    return getattr(importlib.import_module(module), name)


def defines(cls: type, name: str) -> bool:
    """``cls`` (or a base) has ``name`` as a class attribute, dataclass field,
    annotation, or an instance attribute assigned in its source (``self.name =``)."""
    if hasattr(cls, name):
        return True
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    assigned = re.compile(rf"\bself\.{re.escape(name)}\s*(:[^=\n]+)?=[^=]")
    for base in cls.__mro__:
        if base.__module__.startswith("vllm") and (
                name in getattr(base, "__annotations__", {})
                or assigned.search(inspect.getsource(base))):
            return True
    return False


@pytest.mark.parametrize("attr", GATE_ATTRIBUTES,
                         ids=[f"{a.owner}.{a.name}" for a in GATE_ATTRIBUTES])
def test_gate_attribute_exists_upstream(attr):
    cls = resolve(attr.vllm_class)
    assert defines(cls, attr.name), f"vLLM's {attr.vllm_class} has no {attr.name}"


def test_the_canary_checks_what_it_says():
    """``defines`` is not vacuous: a renamed attribute fails it."""
    runner = resolve("vllm.v1.worker.gpu.model_runner.GPUModelRunner")
    assert defines(runner, "batch_sharder")
    assert not defines(runner, "batch_shardr")


@pytest.mark.parametrize("place", sorted(GATE_TYPES))
def test_gate_types_resolve_to_vllm_classes(place):
    for name in GATE_TYPES[place]:
        cls = resolve(name)
        assert gate.type_name(object.__new__(cls)) == name


def test_safe_logits_processors_are_exactly_the_samplers_built_ins():
    """``Sampler.__init__`` builds these processors, then appends only the custom ones;
    a new built-in processor must be judged (and allow-listed) before it is trusted."""
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    src = inspect.getsource(Sampler.__init__)
    built = set(re.findall(r"(\w+)\(vllm_config, lp_req_state\)", src))
    allowed = {name.rpartition(".")[2] for name in gate.SAFE_LOGITS_PROCESSOR_TYPES}
    assert built == allowed
    for name in gate.SAFE_LOGITS_PROCESSOR_TYPES:
        assert issubclass(resolve(name), LogitsProcessor)
    listed = re.search(r"self\.logits_processors[^=]*=\s*\[(.*?)\]", src, re.S).group(1)
    assert " ".join(listed.split()) == (
        "logit_bias_state, self.penalties_state, bad_words_state, *custom_logits_processors,")
    for var, cls in (("logit_bias_state", "LogitBiasState"),
                     ("self.penalties_state", "PenaltiesState"),
                     ("bad_words_state", "BadWordsState")):
        assert f"{var} = {cls}(" in src


def test_sharded_path_input_batch_fields_exist():
    from vllm.v1.worker.gpu.input_batch import InputBatch

    fields = {f.name for f in dataclasses.fields(InputBatch)}
    missing = set(gate.SHARDED_PATH_INPUT_BATCH_FIELDS) - fields
    assert not missing, f"InputBatch lost {sorted(missing)}"


def test_rejection_methods_the_gate_refuses_by_name():
    """The gate maps vLLM's ``rejection_sample_method`` values through these
    attributes; a new method must be judged before it is verified sharded."""
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    src = inspect.getsource(RejectionSampler.__init__)
    methods = set(re.findall(r'rejection_sample_method == "(\w+)"', src))
    assert methods == {"synthetic", "block", "fly"}


@pytest.mark.parametrize("owner,name", WARM_UP_ATTRIBUTES,
                         ids=[f"{o.rpartition('.')[2]}.{n}" for o, n in
                              WARM_UP_ATTRIBUTES])
def test_warm_up_attribute_exists_upstream(owner, name):
    """What the graph warm-up reads after vLLM's ``capture_model`` (a missing one skips the
    warm-up: every sharded step then runs eagerly, counted ``not_warmed_up``)."""
    assert defines(resolve(owner), name), f"vLLM's {owner} has no {name}"

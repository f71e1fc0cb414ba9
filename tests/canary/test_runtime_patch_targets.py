"""Canary: every runtime patch in vllm_kimi_ext/runtime/ imports against vLLM 0.34.0
and every attribute it replaces exists there with the parameters its body assumes.
When one fails after an upgrade, the named patch (and its note,
upstream-notes/R*.md) is what must be revisited, or deleted if upstream now does it."""

from __future__ import annotations

import inspect

import pytest

from vllm_kimi_ext import runtime

pytestmark = [pytest.mark.vllm, pytest.mark.canary]

DECLARED = runtime.declared_patches()


@pytest.mark.parametrize("declared", DECLARED, ids=[d.ref for d in DECLARED])
def test_patch_target_attributes_exist_upstream(declared):
    cls = runtime.resolve(declared.ref)  # imports the module, hence vLLM's target
    assert cls._target.__name__ == declared.target
    assert set(cls.replacements()) == set(declared.attributes)
    for name, replacement in cls.replacements().items():
        assert name not in cls._new_attributes, f"{declared.ref} adds {name}: say why in its note"
        upstream = getattr(cls._target, name, None)
        assert callable(upstream), f"vLLM's {declared.target}.{name} is gone"
        if isinstance(replacement, classmethod):  # compare as bound, like ``upstream``
            replacement = replacement.__get__(None, cls._target)
        mine = list(inspect.signature(replacement).parameters)
        if any(inspect.signature(replacement).parameters[p].kind in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) for p in mine):
            continue  # forwards whatever vLLM passes
        theirs = list(inspect.signature(upstream).parameters)
        assert mine == theirs, f"{declared.target}.{name}{theirs} vs {declared.ref}{mine}"


def test_the_canary_sees_every_patch_class():
    assert {c.__name__ for c in runtime.patch_classes()} == {d.name for d in DECLARED}

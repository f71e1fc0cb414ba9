"""The runtime Patch[Target] helper."""

from __future__ import annotations

import logging
import types

import pytest

from vllm_kimi_ext.patching import Patch, PatchConflictError, PatchError, applied_patches


class Greeter:
    def hello(self) -> str:
        return "hello"


class LoudGreeter(Greeter):
    pass


def test_apply_replace_keep_original_and_revert(caplog):
    class Shout(Patch[Greeter]):
        def hello(self) -> str:
            return Shout.original("hello")(self).upper()

    with caplog.at_level(logging.DEBUG, logger="vllm_kimi_ext.patching"):
        assert Shout.apply() is True
    try:
        assert Greeter().hello() == "HELLO"
        assert "Shout patched Greeter.hello (was Greeter.hello)" in caplog.text
        assert applied_patches()["Shout"] == ["Greeter.hello"]
        assert Shout.apply() is False  # re-entrant: same patch again is a no-op
        assert Greeter().hello() == "HELLO"  # ...and did not wrap twice
    finally:
        assert Shout.revert() is True
    assert Greeter().hello() == "hello"
    assert Shout.revert() is False


class Callable_:
    def __call__(self) -> str:
        return "called"


def test_special_methods_are_patchable_and_class_machinery_is_not():
    class Louder(Patch[Callable_]):
        """A docstring is class machinery, not a replacement."""

        note: str  # so is an annotation

        def __call__(self) -> str:
            return Louder.original("__call__")(self).upper()

    assert set(Louder.replacements()) == {"__call__"}
    Louder.apply()
    try:
        assert Callable_()() == "CALLED"
    finally:
        Louder.revert()
    assert Callable_()() == "called"


def test_second_patch_on_same_attribute_is_refused():
    class A(Patch[Greeter]):
        def hello(self):
            return "a"

    class B(Patch[Greeter]):
        def hello(self):
            return "b"

    A.apply()
    try:
        with pytest.raises(PatchConflictError, match="already patched by A"):
            B.apply()
        assert Greeter().hello() == "a"
    finally:
        A.revert()


def test_unknown_attribute_is_refused_unless_declared_new():
    class Typo(Patch[Greeter]):
        def helo(self):
            return "typo"

    with pytest.raises(PatchError, match="has no attribute 'helo'"):
        Typo.apply()
    assert not hasattr(Greeter, "helo")

    class Adds(Patch[Greeter]):
        _new_attributes = frozenset({"wave"})

        def wave(self):
            return "wave"

    Adds.apply()
    assert Greeter().wave() == "wave"
    with pytest.raises(AttributeError, match="did not exist before"):
        Adds.original("wave")
    Adds.revert()
    assert not hasattr(Greeter, "wave")


def test_inherited_attribute_is_restored_by_uncovering():
    class OnSubclass(Patch[LoudGreeter]):
        def hello(self):
            return "sub:" + OnSubclass.original("hello")(self)

    OnSubclass.apply()
    assert LoudGreeter().hello() == "sub:hello"
    assert Greeter().hello() == "hello"
    OnSubclass.revert()
    assert "hello" not in LoudGreeter.__dict__
    assert LoudGreeter().hello() == "hello"


def test_module_target_and_failed_validation_changes_nothing():
    mod = types.ModuleType("fake_mod")
    mod.f = lambda: 1
    mod.g = lambda: 2

    class ModPatch(Patch):
        _target = mod

        def f():  # noqa: N805 - module functions take no self
            return 10

        def missing():  # noqa: N805
            return 0

    with pytest.raises(PatchError):
        ModPatch.apply()
    assert mod.f() == 1  # validation happens before any replacement


def test_patch_without_target_is_an_error():
    class NoTarget(Patch):
        def x(self):
            pass

    with pytest.raises(PatchError, match="names no target"):
        NoTarget.apply()

"""Runtime patches of upstream attributes, one small class per change.

A runtime patch is written as a class that names what it patches and holds the
replacement attributes::

    class CountAllReduce(Patch[GroupCoordinator]):
        def all_reduce(self, input_):
            ...
            return CountAllReduce.original("all_reduce")(self, input_)

    CountAllReduce.apply()     # logs "patched GroupCoordinator.all_reduce"
    CountAllReduce.revert()    # puts the original back

Rules the helper enforces, because silent double patching is the classic
plugin bug (a second ``register()`` call in the same process wrapping a
wrapper):

* an attribute can be patched by one patch class at a time — a second
  ``apply()`` of a *different* class on the same attribute raises
  :class:`PatchConflictError`; re-applying the *same* class is a no-op, so
  ``apply()`` is re-entrant;
* every replaced attribute must exist on the target unless it is listed in
  ``_new_attributes`` (a typo must not silently add a method nobody calls);
* the original is kept and reachable through ``original(name)``;
* each replacement is logged at DEBUG with the original's qualified name (the
  plugin logs one INFO line naming the patches it installed);
* special methods (``__call__``, ...) are patchable: a dunder name counts as a
  replacement when the class body defines it as a function, so the class
  machinery (``__module__``, ``__doc__``, ``__init_subclass__``, ...) never does.

Module targets work too: set ``_target = some_module`` instead of using the
subscript form.
"""

from __future__ import annotations

import logging
import types
from typing import Any, ClassVar, Generic, TypeVar

logger = logging.getLogger("vllm_kimi_ext.patching")

T = TypeVar("T")

_MISSING = object()
# (id(target), attribute name) -> (patch class, own original or _MISSING, effective original)
_APPLIED: dict[tuple[int, str], tuple[type, Any, Any]] = {}


class PatchError(RuntimeError):
    """A runtime patch could not be applied as written."""


class PatchConflictError(PatchError):
    """Two different patches tried to replace the same attribute."""


def _target_name(target: Any) -> str:
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))


class Patch(Generic[T]):
    """Base class of runtime patches; see the module docstring."""

    _target: ClassVar[Any] = None
    #: attribute names the patch may add although the target lacks them
    _new_attributes: ClassVar[frozenset[str]] = frozenset()
    _RESERVED: ClassVar[frozenset[str]] = frozenset(
        {"_target", "_new_attributes", "_RESERVED", "_MACHINERY", "_applied"}
    )
    #: dunders a class body may define that are class machinery, not replacements
    _MACHINERY: ClassVar[frozenset[str]] = frozenset(
        {"__init_subclass__", "__class_getitem__", "__annotate__"}
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_target") is None:
            for base in getattr(cls, "__orig_bases__", ()):
                args = getattr(base, "__args__", ())
                if getattr(base, "__origin__", None) is Patch and args:
                    if isinstance(args[0], TypeVar):
                        continue
                    cls._target = args[0]
                    break

    @classmethod
    def replacements(cls) -> dict[str, Any]:
        """The attributes this patch installs, by name."""
        out = {}
        for name, value in cls.__dict__.items():
            if name in cls._RESERVED:
                continue
            if name.startswith("__") and name.endswith("__") and (
                    name in cls._MACHINERY or not isinstance(value, types.FunctionType)):
                continue
            out[name] = value
        return out

    @classmethod
    def _check_target(cls) -> Any:
        target = cls._target
        if target is None:
            raise PatchError(f"{cls.__name__} names no target (use Patch[Target] or _target)")
        if not isinstance(target, (type, types.ModuleType)):
            raise PatchError(f"{cls.__name__}: target {target!r} is not a class or module")
        return target

    @classmethod
    def is_applied(cls) -> bool:
        target = cls._check_target()
        return any(
            _APPLIED.get((id(target), name), (None,))[0] is cls for name in cls.replacements()
        )

    @classmethod
    def apply(cls) -> bool:
        """Install the replacements; returns False if this patch was already applied."""
        target = cls._check_target()
        repl = cls.replacements()
        if not repl:
            raise PatchError(f"{cls.__name__} replaces nothing")
        # validate everything first, so a failing patch changes nothing
        for name in repl:
            holder = _APPLIED.get((id(target), name))
            if holder is not None and holder[0] is not cls:
                raise PatchConflictError(
                    f"{cls.__name__} cannot patch {_target_name(target)}.{name}: "
                    f"already patched by {holder[0].__name__}"
                )
            if name not in cls._new_attributes and not hasattr(target, name):
                raise PatchError(
                    f"{cls.__name__}: {_target_name(target)} has no attribute {name!r} "
                    "(upstream changed? list it in _new_attributes if it is meant to be new)"
                )
        if cls.is_applied():
            return False
        for name, value in repl.items():
            own = target.__dict__.get(name, _MISSING)
            effective = getattr(target, name, _MISSING)
            _APPLIED[(id(target), name)] = (cls, own, effective)
            setattr(target, name, value)
            shown = getattr(effective, "__qualname__", None) or (
                "nothing" if effective is _MISSING else repr(effective))
            logger.debug("vllm-kimi-ext: %s patched %s.%s (was %s)",
                        cls.__name__, _target_name(target), name, shown)
        return True

    @classmethod
    def original(cls, name: str) -> Any:
        """The attribute ``name`` as it was before this patch (works unapplied too)."""
        target = cls._check_target()
        holder = _APPLIED.get((id(target), name))
        if holder is None or holder[0] is not cls:
            return getattr(target, name)
        if holder[2] is _MISSING:
            raise AttributeError(
                f"{_target_name(target)}.{name} did not exist before {cls.__name__}")
        return holder[2]

    @classmethod
    def revert(cls) -> bool:
        """Restore the originals; returns False if the patch was not applied."""
        target = cls._check_target()
        done = False
        for name in cls.replacements():
            holder = _APPLIED.get((id(target), name))
            if holder is None or holder[0] is not cls:
                continue
            if holder[1] is _MISSING:
                delattr(target, name)  # an inherited or new attribute: uncover it
            else:
                setattr(target, name, holder[1])
            del _APPLIED[(id(target), name)]
            done = True
        if done:
            logger.debug("vllm-kimi-ext: %s reverted", cls.__name__)
        return done


def applied_patches() -> dict[str, list[str]]:
    """``{patch class name: [target.attr, ...]}`` for everything applied now."""
    out: dict[str, list[str]] = {}
    for (_, name), (cls, _, _) in _APPLIED.items():
        out.setdefault(cls.__name__, []).append(f"{_target_name(cls._target)}.{name}")
    return out

"""Every runtime patch the plugin installs in vLLM, and the one place that applies them.

Layout: one module per patched upstream class, named after it
(``GPUModelRunner`` -> ``gpu_model_runner.py``); in it, module-level
:class:`~vllm_kimi_ext.patching.Patch` classes named ``<Target><What>``, with
thin bodies that call product code (``comm``, ``drafts``, ``verify``). Each
class has a note, ``upstream-notes/R<NN>-*.md``. The modules import vLLM at
import time; this package does not, and imports a module only when one of its
patches is installed or listed.

:data:`FEATURES` says which flag installs which patches (``flag=None``: always,
while the plugin is on). :func:`install` is the only caller of ``Patch.apply``
in the product: :func:`apply_all` (the plugin) and
``CollectiveCounter.start`` (which needs :data:`GROUP_COUNTING`; this package registers
the installer with ``comm.accounting`` on import, so comm never imports runtime) go
through it.

Attribute ownership: the helper refuses a second class on an attribute that is
already patched (``PatchConflictError``), so every (target, attribute) belongs
to exactly one class here, whatever flags are on
(``tests/unit/test_runtime_layout.py`` checks that no two classes share one and
``tests/vllm/test_runtime_patches.py`` installs all of them together). A feature
that needs an attribute another feature already patches extends that class's
body (calling both features' product functions in a fixed order) instead of
adding a second class.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import sys
from pathlib import Path

from vllm_kimi_ext import envs
from vllm_kimi_ext.comm import accounting
from vllm_kimi_ext.patching import Patch

#: the GroupCoordinator patch every CollectiveCounter needs
GROUP_COUNTING = "group_coordinator:GroupCoordinatorCounting"


@dataclasses.dataclass(frozen=True)
class Feature:
    name: str
    flag: envs.Flag | None  # None: installed whenever the plugin is on
    patches: tuple[str, ...]  # "module:Class" under this package


FEATURES: tuple[Feature, ...] = (
    Feature("configuration-time draft checks", None,
            ("vllm_config:VllmConfigDraftCheck",)),
    Feature("Kimi-K2.5 MTP drafts", None,
            ("speculative_config:SpeculativeConfigKimiK25MTP",
             "mtp_speculator_config:MTPSpeculatorConfigKimiK25MTP")),
    Feature("live collective counting", envs.COUNT_COLLECTIVES,
            (GROUP_COUNTING, "gpu_model_runner:GPUModelRunnerStepCounting",
             "rejection_sampler:RejectionSamplerVerifyPhase")),
    Feature("draft agreement check", envs.CHECK_DRAFT_AGREEMENT,
            ("draft_model_speculator:DraftModelSpeculatorAgreementCheck",)),
    Feature("replicated draft embedding", envs.REPLICATE_DRAFT_EMBEDDING,
            ("target_dependent_ar_speculator:TargetDependentARSpeculatorReplicatedEmbedding",
             "speculative_config:SpeculativeConfigReplicatedEmbeddingFactor")),
    Feature("vocabulary-sharded verification", envs.SHARDED_VERIFY,
            ("sampler:SamplerRememberParams",
             "gpu_model_runner:GPUModelRunnerShardedVerify")),
)


def resolve(ref: str | type[Patch]) -> type[Patch]:
    """``"module:Class"`` (imports the module) -> the patch class."""
    if isinstance(ref, type):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def module_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__))


def patch_classes() -> list[type[Patch]]:
    """Every patch class defined in this package (imports every module)."""
    out = []
    for name in module_names():
        module = importlib.import_module(f"{__name__}.{name}")
        out += [v for v in vars(module).values()
                if isinstance(v, type) and issubclass(v, Patch) and v is not Patch
                and v.__module__ == module.__name__]
    return out


@dataclasses.dataclass(frozen=True)
class Declared:
    """A patch class as its source declares it (read without importing vLLM)."""

    module: str
    name: str
    target: str  # the subscript of Patch[...]
    attributes: tuple[str, ...]

    @property
    def ref(self) -> str:
        return f"{self.module}:{self.name}"


def declared_patches() -> list[Declared]:
    """Every ``class X(Patch[Target])`` in this package's modules, from their
    source (the list a reader or a lint needs, without vLLM installed)."""
    out = []
    for name in module_names():
        tree = ast.parse((Path(__file__).parent / f"{name}.py").read_text())
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                if isinstance(base, ast.Subscript) and ast.unparse(base.value) == "Patch":
                    attrs = []
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            attrs.append(item.name)
                        elif isinstance(item, ast.Assign):
                            attrs += [t.id for t in item.targets if isinstance(t, ast.Name)]
                    out.append(Declared(name, node.name, ast.unparse(base.slice), tuple(attrs)))
    return out


def selected(environ=None) -> list[str]:
    """The patches the flags call for now (read at call time), in install order."""
    refs: list[str] = []
    for feature in FEATURES:
        if feature.flag is None or feature.flag.get(environ):
            refs += [r for r in feature.patches if r not in refs]
    return refs


def install(*refs: str | type[Patch]) -> list[str]:
    """Apply the given patches; returns the names applied now (re-entrant)."""
    return [cls.__name__ for cls in map(resolve, refs) if cls.apply()]


def apply_all() -> list[str]:
    """The plugin's runtime patches for the flags set now; starts live collective
    counting when ``VLLM_KIMI_EXT_COUNT_COLLECTIVES`` asks for it."""
    applied = install(*selected())
    register_models()
    every = envs.COUNT_COLLECTIVES.get()
    if every:
        accounting.start_live_counting(every)
    return applied


def register_models() -> None:
    """Model classes the plugin adds through vLLM's ``ModelRegistry`` (a registration
    API, not a patch): the Kimi-K2.5 MTP draft the "Kimi-K2.5 MTP drafts" patches name."""
    from vllm_kimi_ext.integration import kimi_mtp

    kimi_mtp.register_model()


def revert_all() -> list[str]:
    """Undo :func:`apply_all` (and any :func:`install`); returns the names reverted."""
    accounting.stop_live_counting()
    refs = [r for f in FEATURES for r in f.patches
            if f"{__name__}.{r.partition(':')[0]}" in sys.modules]  # never imported: not applied
    return [cls.__name__ for cls in map(resolve, reversed(refs)) if cls.revert()]


# CollectiveCounter.start() (comm, which must not import this package) installs the
# GroupCoordinator counting patch through this.
accounting.register_group_patch_installer(lambda: install(GROUP_COUNTING))

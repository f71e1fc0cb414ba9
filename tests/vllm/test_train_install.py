"""The training install: the `train` extra plus speculators without its declared
dependencies covers every module the training commands import, and replaces neither
torch nor transformers (speculators 0.9.0's own pins would)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("speculators", reason="training stack not installed")
tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads pyproject.toml")

REPO = Path(__file__).resolve().parents[2]
#: what the training commands import, in a fresh process
PROBE = """
import json, sys
import vllm_kimi_ext.train.trainer, vllm_kimi_ext.train.evaluate, vllm_kimi_ext.train.capture
import vllm_kimi_ext.train.regenerate, vllm_kimi_ext.train.runstate
import speculators.models.eagle3, speculators.models.eagle3.data, speculators.losses
import speculators.train.data, speculators.train.distributed_batch_sampler
import speculators.train.distributed, speculators.utils.loading
import datasets, pyarrow  # write_speculators_dataset
print(json.dumps(sorted({m.split(".")[0] for m in list(sys.modules)})))
"""
REPLACED = {"torch", "torchvision", "torchaudio", "transformers", "speculators"}
#: imported when installed, not needed otherwise, with where
OPTIONAL = {"scipy": "transformers/loss/loss_for_object_detection.py imports scipy.optimize "
                     "only if is_scipy_available()"}


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _extra(name: str) -> list[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return data["project"]["optional-dependencies"][name]


def _closure(roots) -> set[str]:
    """Installed distributions reachable from ``roots`` through their requirements
    (environment markers evaluated, optional extras left out)."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [_name(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in reqs:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            todo.append(_name(req.name))
    return seen


def test_the_train_extra_replaces_neither_torch_nor_transformers():
    extra = _extra("train")
    assert extra and not ({_name(r) for r in extra} & REPLACED), extra
    noxfile = (REPO / "noxfile.py").read_text()
    assert 'TRAIN_NO_DEPS = ["speculators==0.9.0"]' in noxfile
    assert '"-e", f"{ROOT}[test,train]"' in noxfile and '"--no-deps", *TRAIN_NO_DEPS' in noxfile
    doc = (REPO / "docs" / "training-a-draft.md").read_text()
    assert "pip install 'vllm-kimi-ext[train]'" in doc
    assert "pip install --no-deps speculators==0.9.0" in doc


def test_every_module_the_training_path_imports_is_installed_by_the_documented_steps():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, cwd=REPO, timeout=300,
                         env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    modules = json.loads(out.stdout.strip().splitlines()[-1])
    owners = metadata.packages_distributions()
    imported = {_name(d) for m in modules if m not in sys.stdlib_module_names
                and not m.startswith("_") for d in owners.get(m, [])}
    allowed = _closure(["vllm", *_extra("train"), "vllm-kimi-ext"]) | {"speculators"}
    missing = sorted(imported - allowed - set(OPTIONAL))
    assert not missing, f"imported but installed by none of the documented steps: {missing}"
    # and speculators' own declared pins are not among what it needs
    assert not ({"torchvision", "torchaudio"} & imported)

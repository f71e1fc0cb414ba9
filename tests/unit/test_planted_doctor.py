"""The doctor's reduced-vocabulary maps, one defect at a time: a single colliding
``d2t`` pair, a single target id ``d2t`` maps to that ``t2d`` leaves unmarked, a
single marked id nothing maps to. Each must be an error naming the ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.checkpoints import (
    TinyEagle3Spec,
    TinyKimiSpec,
    write_tiny_eagle3,
    write_tiny_kimi_k25,
)
from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose

TARGET = TinyKimiSpec(num_hidden_layers=6)
DRAFT_VOCAB = 300


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("planted-doctor")
    write_tiny_kimi_k25(path, TARGET)
    return path


@pytest.fixture()
def head(tmp_path):
    """``(directory, tensors)`` of a clean reduced-vocabulary head; ``save(**t)``
    rewrites its tensors."""
    from safetensors.torch import load_file

    path = tmp_path / "head"
    write_tiny_eagle3(path, TARGET, TinyEagle3Spec(draft_vocab_size=DRAFT_VOCAB))
    return path, load_file(path / "model.safetensors")


def _save(path: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def _errors(target: Path, path: Path) -> dict:
    report = diagnose(target, path, method="eagle3")
    return {f.code: f.message for f in report.findings if f.severity == "error"}


def test_the_clean_head_has_no_findings(target, head):
    path, tensors = head
    assert int(tensors["t2d"].sum()) == DRAFT_VOCAB
    assert _errors(target, path) == {}


def test_one_colliding_d2t_pair(target, head):
    path, tensors = head
    d2t = tensors["d2t"].clone()
    kept = (d2t + d2t.new_tensor(range(DRAFT_VOCAB))).tolist()
    d2t[201] = kept[200] - 201  # draft ids 200 and 201 both -> target id kept[200]
    _save(path, {**tensors, "d2t": d2t})
    errors = _errors(target, path)
    assert list(errors) == ["E-D2T-DUPLICATE"], errors
    msg = errors["E-D2T-DUPLICATE"]
    assert "1 collisions" in msg and f"draft ids [200, 201] -> target id {kept[200]}" in msg
    assert f"only {DRAFT_VOCAB - 1} distinct" in msg


def test_one_collision_at_the_last_draft_id(target, head):
    path, tensors = head
    d2t = tensors["d2t"].clone()
    last = DRAFT_VOCAB - 1
    d2t[last] = int(d2t[0]) - last  # the last draft id onto draft id 0's target
    _save(path, {**tensors, "d2t": d2t})
    assert f"draft ids [0, {last}]" in _errors(target, path)["E-D2T-DUPLICATE"]


def test_one_mapped_target_id_not_marked_in_t2d(target, head):
    path, tensors = head
    t2d = tensors["t2d"].clone()
    kept = t2d.nonzero().flatten().tolist()
    t2d[kept[-1]] = False  # the last kept id
    _save(path, {**tensors, "t2d": t2d})
    msg = _errors(target, path)["E-T2D-MISMATCH"]
    assert f"marks {DRAFT_VOCAB - 1} target ids but d2t maps to {DRAFT_VOCAB}" in msg
    assert f"mapped but not marked: [{kept[-1]}]" in msg and "marked but not mapped: []" in msg


def test_one_marked_target_id_nothing_maps_to(target, head):
    path, tensors = head
    t2d = tensors["t2d"].clone()
    spare = int((~t2d).nonzero()[0])
    t2d[spare] = True
    _save(path, {**tensors, "t2d": t2d})
    msg = _errors(target, path)["E-T2D-MISMATCH"]
    assert f"marked but not mapped: [{spare}]" in msg and "mapped but not marked: []" in msg


def test_one_id_moved_in_t2d(target, head):
    """Same count, one id different: a count comparison alone would pass this."""
    path, tensors = head
    t2d = tensors["t2d"].clone()
    kept = t2d.nonzero().flatten().tolist()
    spare = int((~t2d).nonzero()[0])
    t2d[kept[0]], t2d[spare] = False, True
    _save(path, {**tensors, "t2d": t2d})
    msg = _errors(target, path)["E-T2D-MISMATCH"]
    assert f"marks {DRAFT_VOCAB} target ids but d2t maps to {DRAFT_VOCAB}" in msg
    assert f"marked but not mapped: [{spare}]" in msg
    assert f"mapped but not marked: [{kept[0]}]" in msg

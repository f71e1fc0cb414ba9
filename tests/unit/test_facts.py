"""Kimi-K2.5 dimensions and published acceptance have one source: the cost model's
profiles, read through ``vllm_kimi_ext.facts``."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

import vllm_kimi_ext
from vllm_kimi_ext import facts
from vllm_kimi_ext.drafts import placement_table as pt

PACKAGE = Path(vllm_kimi_ext.__file__).parent

# Package modules that still spell a Kimi dimension as a number literal; delete an entry
# when its module reads vllm_kimi_ext.facts (or leaves). The test fails on stale entries.
# (The GPU kernel check, which sizes one case like Kimi-K2.5 on purpose, left the package
# for testkit/.)
LITERAL_ALLOW_LIST: set[str] = set()


def _modules_with_literals(values: set[int]) -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and type(node.value) is int \
                    and node.value in values:
                found.add(path.relative_to(PACKAGE).as_posix())
    return found


def test_kimi_dims_are_not_repeated_as_literals():
    dims = facts.target_dims()
    found = _modules_with_literals({dims.vocab_size, dims.hidden_size})
    assert found - LITERAL_ALLOW_LIST == set(), \
        "read these from vllm_kimi_ext.facts.target_dims() instead of a literal"
    assert LITERAL_ALLOW_LIST - found == set(), "stale allow-list entries: remove them"


def test_published_acceptance_comes_from_the_draft_profiles():
    eagle3 = facts.published_acceptance(pt.EAGLE3_DRAFT)
    assert eagle3.k == 3 and set(eagle3.lengths) == {"mt-bench", "gsm8k", "humaneval"}
    with pytest.raises(TypeError):
        eagle3.lengths["gsm8k"] = 1.0  # read-only: a caller cannot change the shared fact
    with pytest.raises(facts.FactsError, match="drafts/aq-medai-eagle3.json: field "
                       "'acceptance.metric' is 'draft_acceptance_rate'"):
        facts.published_acceptance("aq-medai-eagle3")  # a rate is not a length


@pytest.fixture
def tamper(monkeypatch):
    """``tamper(kind, name, edit)``: edit a profile in memory (facts' caches cleared)."""
    real = facts._profile
    edits = {}

    def fake(kind, name):
        shown, data = real(kind, name)
        data = copy.deepcopy(data)
        for edit in edits.get((kind, name), []):
            edit(data)
        return shown, data

    def clear():
        facts.target_dims.cache_clear()
        facts.published_acceptance.cache_clear()

    def add(kind, name, edit):
        edits.setdefault((kind, name), []).append(edit)
        clear()

    monkeypatch.setattr(facts, "_profile", fake)
    yield add
    monkeypatch.undo()
    clear()


def test_placement_table_follows_the_profiles(tamper):
    base_rows = pt.table("gsm8k")
    tamper("models", "kimi-k2.5", lambda d: d.update(num_layers=10))
    tamper("drafts", "lightseek-eagle3", lambda d: d["acceptance"]["values"].update(gsm8k=2.5))
    assert pt.per_step(0) == 2 * 10 + 1 + 1
    rows = pt.table("gsm8k")
    assert rows != base_rows and "τ(3) = 2.5" in rows[2]
    # the fitted rate reproduces the tampered τ(3) in the table, and the target
    # pass is the tampered 21 all-reduces: (21 + 4·3 + 1) / 2.5 = 13.6
    assert "| 3 | 2.50 | 13.6 |" in "\n".join(rows)


def test_a_missing_field_names_the_file_and_the_field(tamper):
    tamper("models", "kimi-k2.5", lambda d: d["collectives"].pop("allreduce_per_layer"))
    with pytest.raises(facts.FactsError) as err:
        facts.target_dims()
    assert str(err.value) == ("vllm_kimi_ext/costmodel/profiles/models/kimi-k2.5.json: field "
                              "'collectives.allreduce_per_layer' missing (expected int)")


def test_a_mistyped_field_names_the_value(tamper):
    tamper("models", "kimi-k2.5", lambda d: d.update(hidden_size="7k"))
    with pytest.raises(facts.FactsError, match="'hidden_size' is '7k' \\(expected int\\)"):
        facts.target_dims()

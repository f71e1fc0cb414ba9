"""Kimi-K2.5 dimensions and published acceptance have one source: the cost model's
profiles, read through ``vllm_kimi_ext.facts``."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import pytest

import vllm_kimi_ext
from vllm_kimi_ext import facts
from vllm_kimi_ext.costmodel import placement_table as pt

PACKAGE = Path(vllm_kimi_ext.__file__).parent

# Package modules that still spell a Kimi dimension as a number literal; delete an entry
# when its module reads vllm_kimi_ext.facts (or leaves). The test fails on stale entries.
# (The GPU kernel check, which sizes one case like Kimi-K2.5 on purpose, left the package
# for testkit/.)
LITERAL_ALLOW_LIST: set[str] = set()


#: Modules that may spell a Kimi special token, each with its reason.
TOKEN_ALLOW_LIST = {
    # copied next to a rank file and imported by transformers as remote code: self-contained,
    # its bos/eos defaults are the ones of Kimi's own tokenization_kimi.py
    "tokenizers/tokenization_kimi.py",
}


def _forbidden_values() -> set[int]:
    """Kimi dims and the public draft shape the package reads through facts: the target's
    vocabulary and hidden size, its dense MLP width, the EAGLE-3 head's MLP width."""
    dims, head = facts.target_dims(), facts.draft_shape("lightseek-eagle3")
    dense = facts._field("models", facts.TARGET_PROFILE, "dense_intermediate_size", int)
    return {dims.vocab_size, dims.hidden_size, dense, head.intermediate_size}


def literal_hits(source: str, values: set[int], tokens: set[str]) -> list[str]:
    """``line: what`` of every int literal in ``values``, every string literal (f-string
    parts and docstrings included) spelling one of them as a whole number, and every string
    literal that is one of ``tokens``."""
    number = re.compile(r"(?<![\w.])(" + "|".join(map(str, sorted(values))) + r")(?![\w.])"
                        if values else r"(?!)")
    hits = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Constant):
            continue
        if type(node.value) is int and node.value in values:
            hits.append(f"{node.lineno}: {node.value}")
        elif isinstance(node.value, str):
            hits += [f"{node.lineno}: {m.group(0)}" for m in number.finditer(node.value)]
            if node.value in tokens:
                hits.append(f"{node.lineno}: {node.value!r}")
    return hits


def _modules_with_literals(values: set[int], tokens: set[str] = frozenset()) -> set[str]:
    return {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
            if path.name != "facts.py"
            and literal_hits(path.read_text(encoding="utf-8"), values, tokens)}


def test_kimi_dims_are_not_repeated_as_literals():
    found = _modules_with_literals(_forbidden_values())
    assert found - LITERAL_ALLOW_LIST == set(), (
        "read these from vllm_kimi_ext.facts (target_dims, draft_shape) instead of a literal")
    assert LITERAL_ALLOW_LIST - found == set(), "stale allow-list entries: remove them"


def test_kimi_special_tokens_are_not_repeated_as_literals():
    found = _modules_with_literals(set(), set(facts.special_tokens().all))
    assert found - TOKEN_ALLOW_LIST == set(), (
        "read these from vllm_kimi_ext.facts.special_tokens() instead of a literal")
    assert TOKEN_ALLOW_LIST - found == set(), "stale allow-list entries: remove them"


@pytest.mark.parametrize("source", [
    "V = 163840", 'HELP = "hidden 7168"', 'x = f"{n} x 7168 / TP"', '"""a [163840, 8] row"""',
    "MLP = 12288", 'T = "<|im_end|>"', "STOP = ('[EOS]',)",
])
def test_a_planted_literal_is_found(source):
    assert literal_hits(source, _forbidden_values(), set(facts.special_tokens().all))


@pytest.mark.parametrize("source", [
    "V = 1638400", 'R = "0.7168"', "x = dims.vocab_size", 'T = "<|im_end|> and more"',
])
def test_other_literals_pass(source):
    assert literal_hits(source, _forbidden_values(), set(facts.special_tokens().all)) == []


def test_special_tokens_and_draft_shape_come_from_the_profiles(tamper):
    tamper("models", "kimi-k2.5", lambda d: d["special_tokens"]["chat"].append("<|x|>"))
    assert facts.special_tokens().all[-1] == "<|x|>"
    tamper("drafts", "lightseek-eagle3", lambda d: d["architecture"].update(head_dim=64))
    assert facts.draft_shape("lightseek-eagle3").head_dim == 64


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
        facts.draft_shape.cache_clear()
        facts.special_tokens.cache_clear()

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


def test_choosing_a_draft_dflash_example_uses_the_profile_layer_count():
    """docs/choosing-a-draft.md's DFlash row is worked for the profile's layer count."""
    text = (PACKAGE.parent / "docs" / "choosing-a-draft.md").read_text()
    m = re.search(r"\(126 \+ 2L\)/τ; e\.g\. L=(\d+): ([\d.]+) / ([\d.]+) \|", text)
    assert m, "the DFlash row of docs/choosing-a-draft.md is gone"
    layers = facts.draft_num_layers(pt.DFLASH_DRAFT)
    acc = facts.published_acceptance(pt.DFLASH_DRAFT).lengths
    dims = facts.target_dims()
    per_step = dims.allreduces_per_pass + dims.logits_allgathers + 2 * layers + 2
    assert (int(m.group(1)), float(m.group(2)), float(m.group(3))) == (
        layers, round(per_step / acc["mt-bench"], 1), round(per_step / acc["gsm8k"], 1))

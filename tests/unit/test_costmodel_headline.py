"""One function makes the headline; README, docs and the bench report print it."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_kimi_ext.costmodel.headline import (
    current_readme_section,
    headline,
    headline_markdown,
    readme_section,
    serve_command,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def h():
    return headline()


def test_readme_section_is_the_headline(h):
    text = (ROOT / "README.md").read_text()
    assert current_readme_section(text) == readme_section(h), (
        "README.md's 'What to run on 8x PCIe' section is stale: regenerate it with "
        "vllm_kimi_ext.costmodel.headline.updated_readme (python -c \"from pathlib import "
        "Path; from vllm_kimi_ext.costmodel.headline import updated_readme as u; "
        "p = Path('README.md'); p.write_text(u(p.read_text()))\")")


def test_docs_carry_the_same_headline(h):
    assert headline_markdown(h) in (ROOT / "docs" / "what-to-run.md").read_text()


def test_headline_is_buildable_and_banded(h):
    assert h.choice.robust.buildable
    t = h.choice.robust_tps
    assert t["low"] <= t["card"] <= t["high"]
    assert h.speedup("low") > 1.0
    md = headline_markdown(h)
    assert f"{t['low']:.0f}-{t['high']:.0f} tok/s" in md and "band" in md
    assert h.draft.raw.get("trained_for", "Kimi-K2.5") == "Kimi-K2.5"


def test_headline_draft_wins_the_low_scenario(h):
    best_low = max(c.robust_tps["low"] for c in h.candidates)
    assert h.choice.robust_tps["low"] >= best_low * 0.98


def test_serve_command(h):
    cmd = serve_command(h.plan, h.choice.robust.requires)
    assert "--kv-cache-dtype fp8" in cmd and f'"num_speculative_tokens": {h.plan.k}' in cmd
    assert ("VLLM_KIMI_EXT=1" in cmd) == bool(h.choice.robust.requires)

"""The answer's rule: evidence levels, point estimate, interval, "worth measuring"."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from vllm_kimi_ext.costmodel import CostModel, load_draft
from vllm_kimi_ext.costmodel.acceptance import (
    field_figures,
    mean_field_to_card_ratio,
    point_for,
)
from vllm_kimi_ext.costmodel.answer_text import (
    current_readme_section,
    headline_markdown,
    readme_section,
)
from vllm_kimi_ext.costmodel.catalog import list_profiles
from vllm_kimi_ext.costmodel.evidence import (
    EXACT,
    FORK,
    MODELLED,
    SIBLING,
    STOCK,
    UPSTREAM_MAIN,
    evidence,
    search_record,
)
from vllm_kimi_ext.costmodel.headline import answer, choose, headline
from vllm_kimi_ext.costmodel.interval import calibrated
from vllm_kimi_ext.costmodel.model import Plan

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def h():
    return headline()


def test_readme_section_is_the_headline(h):
    text = (ROOT / "README.md").read_text()
    assert current_readme_section(text) == readme_section(h), (
        "README.md's 'What to run on 8x PCIe' section is stale: regenerate it with "
        "python -m bench.harness.readme --write-docs .")


def test_interval_is_the_calibrated_one_around_the_point_and_the_band_is_separate(h):
    c = h.choice
    lo, hi = c.interval
    assert (lo, hi) == pytest.approx(calibrated().around(c.tps["point"]))
    assert lo < c.tps["point"] < hi
    assert c.band_tps == (pytest.approx(c.tps["low"]), pytest.approx(c.tps["high"]))
    md = headline_markdown(h)
    assert f"**{lo:.0f}..{hi:.0f} tok/s**" in md and "80% interval" in md
    assert f"{c.band_tps[0]:.0f}..{c.band_tps[1]:.0f} tok/s" in md  # the band, separately
    nlo, nhi = h.no_spec_interval
    assert nlo < h.no_spec_tps < nhi and f"{nlo:.0f}..{nhi:.0f} tok/s" in md


def test_point_estimate_is_field_acceptance_else_the_shrunk_card():
    drafts = [load_draft(n) for n in list_profiles("drafts")]
    ratio = mean_field_to_card_ratio(drafts)
    mla = load_draft("lightseek-eagle3-mla")
    assert point_for(mla, ratio=ratio) == field_figures(mla.acceptance)[0]  # field figure
    dflash = load_draft("zlab-dflash")
    k = dflash.acceptance["k_ref"]
    card = dflash.acceptance["values"][dflash.acceptance["default_dataset"]]
    assert point_for(dflash, ratio=ratio).tau(k) == pytest.approx(1 + (card - 1) * ratio)
    assert 0 < ratio < 1


def test_every_configuration_carries_its_evidence_level():
    """Planted bug: a sibling run counted as this checkpoint's (``is_exact`` comparing the
    publisher only); this fails on ``ev.level == SIBLING``."""
    mla, dflash = load_draft("lightseek-eagle3-mla"), load_draft("zlab-dflash")
    plan = Plan(k=3, draft=mla, batch=1, context=1024, backend="nccl")
    ev = evidence(plan)
    # the K2.6 Eagle3.1 head on a K2.6 target, upstream main: a sibling, and a calibration run
    assert ev.level == SIBLING and ev.stacks == (UPSTREAM_MAIN,) and ev.calibration
    assert ev.ranks_as_measured and "models/kimi-k26-v6.md" in ev.text()
    assert "calibration runs" in ev.short() and "sibling checkpoint" in ev.short()
    assert evidence(dataclasses.replace(plan, k=4)).level == MODELLED
    # the fp8 copy with the one-shot all-reduce ran on a fork image (v4, a calibration run):
    # measured, not ranked as measured
    oneshot = evidence(dataclasses.replace(plan, backend="custom_oneshot"))
    assert oneshot.level == SIBLING and oneshot.stacks == (FORK,)
    assert not oneshot.ranks_as_measured and oneshot.calibration
    fork = evidence(Plan(k=7, draft=dflash, batch=1, context=1024))
    assert fork.level == SIBLING and not fork.ranks_as_measured
    assert evidence(Plan(k=5, draft=dflash, batch=1, context=1024)).level == MODELLED
    # this checkpoint on its own target, stock vLLM: the exact level
    run = {**mla.raw["public_runs"][0], "checkpoint": mla.checkpoint, "target": "Kimi-K2.5",
           "stack": STOCK, "source": {"repo": "x/y", "file": "z.md", "commit": "0" * 40}}
    twin = dataclasses.replace(mla, raw={**mla.raw, "public_runs": [run]})
    exact = evidence(dataclasses.replace(plan, draft=twin))
    assert exact.level == EXACT and exact.ranks_as_measured and not exact.calibration


def test_the_answer_is_the_measured_configuration_and_dflash_is_worth_measuring(h):
    assert h.choice.evidence.ranks_as_measured
    assert h.worth_measuring is not None and not h.worth_measuring.evidence.measured
    w = h.worth_measuring
    assert w.tps["point"] > h.choice.tps["point"] and not w.clears(h.choice)
    md = headline_markdown(h)
    assert "**Worth measuring**" in md and "bench/e2e/runner.py recommendation" in md


def _judged(h, **tps):
    """A copy of the headline's choice with other numbers."""
    c = h.choice
    return dataclasses.replace(c, tps={**c.tps, **tps})


def test_a_modelled_configuration_wins_only_when_its_interval_clears(h):
    m = h.choice
    w = h.worth_measuring
    # not cleared: the measured one is recommended, the other worth measuring
    assert choose([m, w]) == (m, w, None)
    # cleared: its low end above the measured high end
    high = m.interval[1]
    cleared = dataclasses.replace(
        w, tps={**w.tps, "point": high / w.calib.low_factor * 1.01})
    assert choose([m, cleared]) == (cleared, None, m)
    # just not cleared
    touching = dataclasses.replace(
        w, tps={**w.tps, "point": high / w.calib.low_factor * 0.99})
    assert choose([m, touching]) == (m, touching, None)
    # slower by point estimate, or within the 2 % tolerance: nothing worth measuring
    slower = dataclasses.replace(w, tps={**w.tps, "point": m.tps["point"] * 1.01})
    assert choose([m, slower]) == (m, None, None)


def test_without_a_measured_configuration_the_fastest_modelled_one_is_recommended():
    cm = CostModel.build("rtx-pro-6000-pcie-x8")
    a = answer(cm, [load_draft("zlab-dflash")])
    assert not a.choice.evidence.ranks_as_measured and a.worth_measuring is None
    assert a.choice.plan.draft.name == "zlab-dflash"


def test_every_recommendation_line_names_its_evidence_and_source(h):
    """Planted bug: ``answer_line`` printing the level without its sources; this fails on
    'models/kimi-k26-v6.md' missing from plan's first line."""
    from vllm_kimi_ext.costmodel.answer_text import answer_line
    from vllm_kimi_ext.costmodel.evidence import WORDS
    from vllm_kimi_ext.costmodel.headline import recommendation

    src = "joninco/rtx6kpro models/kimi-k26-v6.md @ 28e9f832cb"
    assert h.choice.evidence.short().startswith(f"{WORDS[SIBLING]} ({UPSTREAM_MAIN}; {src})")
    assert src in answer_line(h)
    assert (f"evidence: {WORDS[SIBLING]} ({UPSTREAM_MAIN}; {src})" in
        recommendation(h).explanation[0])
    assert ("Evidence: **" + WORDS[SIBLING] in headline_markdown(h) and src in
        headline_markdown(h))
    text = (ROOT / "docs" / "what-to-run.md").read_text()
    table = text.split("## Every draft, ranked by evidence", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| `")]
    assert rows
    for row in rows:
        if "no acceptance published" not in row:
            assert any(w in row for w in WORDS.values()), row


def test_the_search_record_covers_every_draft_and_feeds_the_evidence(monkeypatch):
    """profiles/public-runs.json lists every draft profile (the lead records the exhaustive
    search there); an exact-checkpoint run recorded in it raises that configuration to
    'this checkpoint measured'."""
    from vllm_kimi_ext.costmodel import evidence as ev_module

    record = ev_module.search_record()
    assert set(record["drafts"]) == set(list_profiles("drafts"))
    assert record["search"]["status"].startswith(("PENDING", "DONE"))
    mla = load_draft("lightseek-eagle3-mla")
    run = {"checkpoint": mla.checkpoint, "target": "Kimi-K2.5", "stack": STOCK, "k": 3,
           "box": "8x RTX PRO 6000", "engine": "vLLM 0.34.0", "settings": "TP8",
           "result": "x tok/s", "source": {"repo": "a/b", "file": "c.md", "commit": "1" * 40}}
    filled = {**record, "drafts": {**record["drafts"], mla.name: {
        **record["drafts"][mla.name], "exact_checkpoint_runs": [run]}}}
    monkeypatch.setattr(ev_module, "search_record", lambda: filled)
    ev = evidence(Plan(k=3, draft=mla, batch=1, context=1024, backend="nccl"))
    assert ev.level == EXACT and ev.runs == (run,) and ev.stacks == (STOCK,)


def test_the_recorded_search_runs_rank_where_their_configuration_says():
    """The recorded exact-checkpoint runs of the MLA head on Kimi-K2.5 ran at DCP 4 and 8,
    which the cost model does not price: they never raise a plan's evidence. The same head on
    Kimi-K2.6 at DCP 1 with a custom PCIe all-reduce (fork images) is sibling evidence for the
    one-shot backend only, and is not ranked as measured (fork). Planted (the DCP check
    dropped from ``_same_configuration``): the one-shot plan reads 'this checkpoint measured'
    and this fails."""
    mla = load_draft("lightseek-eagle3-mla")
    found = search_record()["drafts"][mla.name]
    assert {r["dcp"] for r in found["exact_checkpoint_runs"]} == {4, 8}
    assert all(r["target"] == "Kimi-K2.5" and len(r["source"]["commit"]) == 40
               for r in found["exact_checkpoint_runs"])
    oneshot = evidence(Plan(k=3, draft=mla, batch=1, context=1024, backend="custom_oneshot"))
    assert oneshot.level == SIBLING and not oneshot.ranks_as_measured
    assert any(r["target"] == "Kimi-K2.6" and r["checkpoint"] == mla.checkpoint
               for r in oneshot.runs)
    assert evidence(Plan(k=3, draft=mla, batch=1, context=1024, backend="nccl")).level == SIBLING

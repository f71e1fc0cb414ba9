"""One answer to "what should I run": the bench's costmodel section, its report, README.md
and docs/what-to-run.md all print :func:`~vllm_kimi_ext.costmodel.headline.headline`, and
every committed bench report's cost-model part is what the code makes today.

Planted bug this was written against: the bench report ran its own ``recommend`` over every
draft with a card (novita-dspark, trained for Kimi-K2.6, at 208 tok/s) while the README
printed the headline (z-lab DFlash, 185 tok/s); ``test_bench_section_prints_the_headline``
fails on that code with "Recommended: novita-dspark".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.harness.sections.base import Context
from bench.harness.sections.costmodel import run_costmodel
from vllm_kimi_ext.costmodel.headline import (
    current_readme_section,
    headline,
    headline_markdown,
    public_status,
    recommendation,
    serve_command,
)
from vllm_kimi_ext.costmodel.options import describe
from vllm_kimi_ext.costmodel.report import markdown_report

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "bench" / "reports"


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    printed: list[str] = []
    outcome = run_costmodel(Context(out=out, caps={"matplotlib": True},
                                    progress=printed.append))
    return outcome, out, "\n".join(printed)


def _recommended_lines(text: str) -> list[str]:
    return re.findall(r"Recommended: ([^>]+?) ->", text)


def test_bench_section_prints_the_headline(section):
    outcome, out, printed = section
    h = headline()
    answer = headline_markdown(h)
    plan_md = (out / "costmodel-plan.md").read_text()
    readme = current_readme_section((ROOT / "README.md").read_text())
    docs = (ROOT / "docs" / "what-to-run.md").read_text()
    for where, text in (("printed", printed), ("report section", outcome.markdown),
                        ("costmodel-plan.md", plan_md), ("README.md", readme),
                        ("docs/what-to-run.md", docs)):
        assert answer in text, f"{where} does not carry the headline"
    # every "Recommended:" line anywhere names the headline's configuration, no other
    for text in (outcome.markdown, plan_md):
        lines = _recommended_lines(text)
        assert lines and set(lines) == {describe(h.plan)}, lines
    data = outcome.data["answer"]
    assert (data["draft"], data["k"], data["placement"], data["verifier"], data["backend"]) \
        == (h.draft.name, h.plan.k, h.plan.placement, h.plan.verifier, h.plan.backend)
    assert data["tokens_per_s_card"] == pytest.approx(h.choice.robust_tps["card"], abs=0.05)
    assert f"**{data['tokens_per_s_card']:.0f} tok/s**" in readme


def test_recommendation_explains_the_headline_choice():
    h = headline()
    rec = recommendation(h)
    assert rec.best is h.choice.robust
    assert rec.explanation[0].startswith(f"Recommended: {describe(h.plan)} -> ")
    assert {o.plan.draft.name for o in rec.options if o.plan.speculative} == {h.draft.name}


def test_a_plan_for_other_inputs_says_it_is_not_the_headline(tmp_path):
    text = markdown_report(tmp_path, drafts=["lightseek-eagle3-mla"])
    assert "not the headline answer" in text and headline_markdown() not in text


def _committed_reports() -> list[Path]:
    out = []
    for results in sorted(REPORTS.glob("*/results.json")):
        doc = json.loads(results.read_text())
        if any(s.get("name") == "costmodel" and s.get("status") == "ok"
               for s in doc.get("sections", [])):
            out.append(results.parent)
    return out


def test_there_is_a_committed_cpu_report():
    assert _committed_reports(), "no committed bench report with a costmodel section"


@pytest.mark.parametrize("report", _committed_reports(), ids=lambda p: p.name)
def test_committed_reports_match_the_code(report, section):
    outcome, out, _ = section
    stale = ("is stale against the cost model: regenerate the report (nox -s bench -- --out "
             f"bench/reports/{report.name}) or delete it")
    assert (report / "costmodel-plan.md").read_text() == (out / "costmodel-plan.md").read_text(), \
        f"{report.name}/costmodel-plan.md {stale}"
    assert outcome.markdown in (report / "report.md").read_text(), \
        f"{report.name}/report.md's cost-model section {stale}"


def test_serve_commands_are_complete():
    h = headline()
    cmd = serve_command(h.plan, h.choice.robust.requires)
    cfg = json.loads(re.search(r"--speculative-config '(\{.*\})'", cmd).group(1))
    assert {"method", "model", "num_speculative_tokens"} <= set(cfg)
    assert "--attention-backend TRITON_MLA" in cmd
    # a DFlash draft beside the MLA target pins its own attention backend, as every public
    # Kimi DFlash run on this card did
    from vllm_kimi_ext.costmodel import load_draft

    d = load_draft("zlab-dflash")
    from vllm_kimi_ext.costmodel.model import Plan

    dflash = serve_command(Plan(k=7, draft=d, batch=1, context=1024, backend="nccl"))
    assert '"attention_backend": "TRITON_ATTN"' in dflash
    for doc in (ROOT / "README.md", ROOT / "docs" / "what-to-run.md"):
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
            if "vllm serve" in block and '"dflash"' in block:
                assert '"attention_backend": "TRITON_ATTN"' in block, doc.name


def test_every_answer_says_whether_it_ran_in_public():
    from vllm_kimi_ext.costmodel import load_draft
    from vllm_kimi_ext.costmodel.model import Plan

    h = headline()
    assert "Public runs: " + public_status(h.plan) in headline_markdown(h)
    d = load_draft("zlab-dflash")
    text = public_status(Plan(k=7, draft=d, batch=1, context=1024, backend="nccl"))
    # the headline draft has never run on stock vLLM with an MLA target in public
    assert text.startswith("**only in the model**") and "SubSir/Kimi-K2.6-DFlash-tmp" in text
    # a public run of the exact configuration would be named as such, with its source
    run = {**d.raw["public_runs"][0], "checkpoint": d.checkpoint, "target": "Kimi-K2.5",
           "stock_vllm": True, "k": 7}
    import dataclasses

    twin = dataclasses.replace(d, raw={**d.raw, "public_runs": [run]})
    ran = public_status(Plan(k=7, draft=twin, batch=1, context=1024, backend="nccl"))
    assert ran.startswith("this exact configuration has run in public") and "@" in ran
    assert public_status(Plan(k=6, draft=twin, batch=1, context=1024, backend="nccl")) \
        .startswith("**only in the model**")  # another k is another configuration

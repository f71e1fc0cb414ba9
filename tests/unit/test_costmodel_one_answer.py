"""One answer to "what should I run": bare ``vllm-kimi-ext plan`` (its first line),
``plan --draft <the answer's draft>`` (its first line), README.md, docs/what-to-run.md,
docs/choosing-a-draft.md, the bench's costmodel section and its report all name the same
draft, k, placement and tokens/s, the ones :func:`~vllm_kimi_ext.costmodel.headline.headline`
returns; every committed bench report's cost-model part is what the code makes today.

Planted bugs this was written against: the bench report ran its own ``recommend`` over every
draft with a card (novita-dspark, 208 tok/s) while the README printed the headline (z-lab
DFlash, 185 tok/s): ``test_bench_section_prints_the_headline`` failed with "Recommended:
novita-dspark". The headline markdown printing the card-acceptance number instead of the
point estimate: ``test_every_reader_names_the_same_configuration`` fails on the number.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.harness.sections.base import Context
from bench.harness.sections.costmodel import run_costmodel
from vllm_kimi_ext.cli import main
from vllm_kimi_ext.costmodel.answer_text import (
    current_readme_section,
    headline_markdown,
    public_status,
)
from vllm_kimi_ext.costmodel.headline import headline, recommendation, serve_command
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
    assert ((data["draft"], data["k"], data["placement"], data["verifier"], data["backend"])
        == (h.draft.name, h.plan.k, h.plan.placement, h.plan.verifier, h.plan.backend))
    assert data["tokens_per_s_point"] == pytest.approx(h.choice.tps["point"], abs=0.05)
    assert data["evidence"] == h.choice.evidence.level
    assert f"**{data['tokens_per_s_point']:.0f} tok/s**" in readme


PLACES = {"sharded over the 8 GPUs like the target (stock)": "tp8",
          "whole on every GPU (draft TP=1)": "tp1"}
MD = re.compile(r"\*\*Draft\*\* `[^`]+` \(`(?P<name>[^`]+)`\), \*\*k = (?P<k>\d+)\*\* "
                r"\(`num_speculative_tokens`\), (?P<place>[^,]+?), \w+ vocabulary;.*?\n"
                r"- Expected \*\*(?P<tps>\d+) tok/s\*\*", re.S)
LINE = re.compile(r"^Answer: `(?P<name>[^`]+)` k = (?P<k>\d+) \((?P<place>[\w-]+)/\w+, \w+, "
                  r"\w+\) -> (?P<tps>\d+) tok/s")


def _from_markdown(text: str, where: str) -> tuple:
    hits = [(m["name"], int(m["k"]), PLACES.get(m["place"], m["place"]), int(m["tps"]))
            for m in MD.finditer(text)]
    assert hits, f"{where}: no answer found"
    assert len(set(hits)) == 1, f"{where}: more than one answer {hits}"
    return hits[0]


def _plan_first_line(capsys, *argv: str) -> tuple:
    assert main(["plan", *argv]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    m = LINE.match(first)
    assert m, first
    return m["name"], int(m["k"]), m["place"], int(m["tps"])


def test_every_reader_names_the_same_configuration(section, capsys):
    outcome, out, printed = section
    h = headline()
    want = (h.draft.name, h.plan.k, h.plan.placement, round(h.choice.tps["point"]))
    got = {
        "plan": _plan_first_line(capsys),
        f"plan --draft {h.draft.name}": _plan_first_line(capsys, "--draft", h.draft.name),
        "README.md": _from_markdown(current_readme_section((ROOT / "README.md").read_text()),
                                    "README.md"),
        "docs/what-to-run.md": _from_markdown((ROOT / "docs/what-to-run.md").read_text(),
                                              "docs/what-to-run.md"),
        "docs/choosing-a-draft.md": _from_markdown(
            (ROOT / "docs/choosing-a-draft.md").read_text(), "docs/choosing-a-draft.md"),
        "nox -s bench (printed)": _from_markdown(printed, "bench output"),
        "bench report": _from_markdown(outcome.markdown, "bench report"),
        "costmodel-plan.md": _from_markdown((out / "costmodel-plan.md").read_text(),
                                            "costmodel-plan.md"),
    }
    wrong = {where: v for where, v in got.items() if v != want}
    assert not wrong, f"expected {want} everywhere; differs: {wrong}"


def test_recommendation_explains_the_headline_choice():
    h = headline()
    rec = recommendation(h)
    assert rec.best.plan == h.plan
    assert rec.best_stock is rec.best  # no "with stock vLLM only: another k" beside it
    assert rec.explanation[0].startswith(f"Recommended: {describe(h.plan)} -> ")
    assert h.draft.name in {o.plan.draft.name for o in rec.options if o.plan.speculative}
    assert not any(line.startswith("With stock vLLM 0.34 only") for line in rec.explanation)


def test_a_plan_for_other_inputs_says_it_is_not_the_headline(tmp_path):
    text = markdown_report(tmp_path, drafts=["lightseek-eagle3-mla"])
    assert "not the answer of README.md" in text and headline_markdown() not in text


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
    assert (report / "costmodel-plan.md").read_text() == (out / "costmodel-plan.md").read_text(), (
        f"{report.name}/costmodel-plan.md {stale}")
    assert outcome.markdown in (report / "report.md").read_text(), (
        f"{report.name}/report.md's cost-model section {stale}")


def test_serve_commands_are_complete():
    h = headline()
    cmd = serve_command(h.plan, h.choice.option.requires)
    cfg = json.loads(re.search(r"--speculative-config '(\{.*\})'", cmd).group(1))
    assert {"method", "model", "num_speculative_tokens"} <= set(cfg)
    assert "--attention-backend TRITON_MLA" in cmd
    # a DFlash draft beside the MLA target pins its own attention backend, as every public
    # Kimi DFlash run on this card did; its RoPE attention factor is unknown, so both arms
    # of the A/B are printed: the published config (1.0 in vLLM 0.34.0) and a copy at 1.4159
    from vllm_kimi_ext.costmodel import load_draft
    from vllm_kimi_ext.costmodel.model import Plan

    d = load_draft("zlab-dflash")
    dflash = serve_command(Plan(k=7, draft=d, batch=1, context=1024, backend="nccl"))
    assert '"attention_backend": "TRITON_ATTN"' in dflash
    assert '"model": "z-lab/Kimi-K2.5-DFlash"' in dflash
    blocks = 0
    for doc in (ROOT / "README.md", ROOT / "docs" / "what-to-run.md",
                ROOT / "docs" / "choosing-a-draft.md"):
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
            if "vllm serve" in block and '"dflash"' in block:
                blocks += 1
                assert '"attention_backend": "TRITON_ATTN"' in block, doc.name
                assert '"model": "z-lab/Kimi-K2.5-DFlash"' in block, doc.name
                assert ("draft rope-config --draft /models/Kimi-K2.5-DFlash --out "
                    "/models/Kimi-K2.5-DFlash-rope-1.4159 --attention-factor 1.4159" in block)
                assert '"model": "/models/Kimi-K2.5-DFlash-rope-1.4159"' in block, doc.name
    assert blocks


def test_a_serve_command_that_needs_the_plugin_enables_it():
    """Planted bug: serve_command without its ``VLLM_KIMI_EXT=1`` prefix; this fails with
    'VLLM_KIMI_EXT=1' not in the tp1 command (the headline's command needs nothing)."""
    from vllm_kimi_ext.costmodel import CostModel, load_draft
    from vllm_kimi_ext.costmodel.model import Plan
    from vllm_kimi_ext.costmodel.options import requirements

    cm = CostModel.build("rtx-pro-6000-pcie-x8")
    plan = Plan(k=3, draft=load_draft("lightseek-eagle3"), placement="tp1", batch=1,
                context=1024)
    req = requirements(cm, plan)
    assert req and all(r.buildable for r in req)  # it needs this project's patches
    cmd = serve_command(plan, req)
    assert (cmd.startswith("VLLM_KIMI_EXT=1 vllm serve") and
        '"draft_tensor_parallel_size": 1' in cmd)
    stock = Plan(k=3, draft=load_draft("lightseek-eagle3"), batch=1, context=1024)
    assert not serve_command(stock, requirements(cm, stock)).startswith("VLLM_KIMI_EXT")


def test_every_answer_names_its_evidence():
    from vllm_kimi_ext.costmodel import load_draft
    from vllm_kimi_ext.costmodel.model import Plan

    h = headline()
    assert "Evidence: " + public_status(h.plan) in headline_markdown(h)
    d = load_draft("zlab-dflash")
    text = public_status(Plan(k=5, draft=d, batch=1, context=1024, backend="nccl"))
    # the DFlash draft has never run on stock vLLM with an MLA target in public
    assert text.startswith("**modelled only") and "SubSir/Kimi-K2.6-DFlash-tmp" in text
    # a public stock run of the exact configuration on this box would be named, with source
    import dataclasses

    run = {**d.raw["public_runs"][0], "checkpoint": d.checkpoint, "target": "Kimi-K2.5",
           "stack": "stock vLLM 0.34.0", "k": 5, "box": "8x RTX PRO 6000"}
    twin = dataclasses.replace(d, raw={**d.raw, "public_runs": [run]})
    ran = public_status(Plan(k=5, draft=twin, batch=1, context=1024, backend="nccl"))
    assert ran.startswith("**measured: this checkpoint on this box class (stock vLLM "
                          "0.34.0)**") and "@" in ran
    assert (public_status(Plan(k=6, draft=twin, batch=1, context=1024, backend="nccl"))
        .startswith("**modelled only"))  # another k is another configuration

"""Section ``costmodel`` (any machine): the cost model's answer for 8x PCIe, a prediction.

It prints and reports :func:`vllm_kimi_ext.costmodel.headline.headline`'s answer, the one
README.md and docs/what-to-run.md show (a test runs this section and compares).
"""

from __future__ import annotations

from bench.harness.sections.base import Context, Outcome

INTRO = ("A **forecast ranked by evidence**, not a measurement: the decode cost model's answer "
         "for Kimi-K2.5 on the calibrated 8x RTX PRO 6000 profile. Every draft and "
         "configuration: "
         "[costmodel-plan.md](costmodel-plan.md).")


def needs_costmodel(caps: dict, ctx: Context) -> str | None:
    return None if caps.get("matplotlib") else "matplotlib not installed (plots)"


def run_costmodel(ctx: Context) -> Outcome:
    from vllm_kimi_ext.costmodel.answer_text import headline_markdown
    from vllm_kimi_ext.costmodel.headline import headline
    from vllm_kimi_ext.costmodel.report import PCIE, markdown_report

    h = headline()
    ctx.progress("what to run (cost model, a forecast):\n" + headline_markdown(h))
    text = markdown_report(ctx.out, name="costmodel-plan",
                           title="Cost-model plan: Kimi-K2.5 on 8x PCIe, TP=8")
    body = text.split("\n", 1)[1].strip()  # drop its title
    short, _, rest = body.partition("**All configurations**")
    rows = sum(1 for ln in rest.split("**Step breakdown")[0].splitlines()
               if ln.startswith("| ") and "---" not in ln) - 1
    p = h.plan
    answer = {"draft": h.draft.name, "checkpoint": h.draft.checkpoint, "k": p.k,
              "placement": p.placement, "vocab": p.vocab, "verifier": p.verifier,
              "backend": p.backend, "evidence": h.choice.evidence.level,
              "tokens_per_s_point": round(h.choice.tps["point"], 1),
              "interval_tokens_per_s": [round(x, 1) for x in h.choice.interval],
              "interval_coverage": h.calib.coverage,
              "worth_measuring": (None if h.worth_measuring is None else {
                  "draft": h.worth_measuring.draft.name, "k": h.worth_measuring.plan.k,
                  "tokens_per_s_point": round(h.worth_measuring.tps["point"], 1)})}
    return Outcome("ok", data={"hardware": PCIE, "configurations": max(rows, 0),
                               "answer": answer},
                   markdown="\n".join([INTRO, "", short.strip()]),
                   artifacts=["costmodel-plan.md", "costmodel-plan.png"])

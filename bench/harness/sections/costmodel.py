"""Section ``costmodel`` (any machine): the cost model's plan for 8x PCIe, a prediction."""

from __future__ import annotations

from bench.harness.sections.base import Context, Outcome


def needs_costmodel(caps: dict, ctx: Context) -> str | None:
    return None if caps.get("matplotlib") else "matplotlib not installed (plots)"


def run_costmodel(ctx: Context) -> Outcome:
    from vllm_kimi_ext.costmodel.headline import headline_markdown
    from vllm_kimi_ext.costmodel.report import PCIE, markdown_report

    # the same text as README.md's "What to run" section and docs/what-to-run.md
    ctx.progress("headline (cost model, a forecast):\n" + headline_markdown())
    text = markdown_report(ctx.out, hardware=PCIE, name="costmodel-plan",
                           title="Cost-model plan: Kimi-K2.5 on 8x PCIe, TP=8")
    body = text.split("\n", 1)[1].strip()  # drop its title
    short, _, rest = body.partition("**All configurations**")
    md = [
        ("A **model**, not a measurement: the decode cost model's recommendation for every "
        "draft with published acceptance, on the calibrated 8x RTX PRO 6000 profile. Full "
        "table of configurations: [costmodel-plan.md](costmodel-plan.md)."),
        "",
        short.strip(),
    ]
    rows = sum(1 for ln in rest.splitlines() if ln.startswith("| ") and "---" not in ln) - 1
    return Outcome("ok", data={"hardware": PCIE, "configurations": max(rows, 0)},
                   markdown="\n".join(md),
                   artifacts=["costmodel-plan.md", "costmodel-plan.png"])

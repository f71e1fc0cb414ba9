"""The generated block ``verify`` of ``docs/cost-model.md`` and its plot: the verify step of
stock vLLM, the vocabulary-sharded verifier and vLLM's batch-sharded sampling per batch,
priced by :mod:`.verify_cost` from the measured report, end to end on the 8x RTX PRO 6000
tables.

``python -m vllm_kimi_ext.costmodel.verify_report --write-docs DIR`` first copies the
checkout's measured report (``DIR/../bench/reports/verify_graph_vs_vllm_h200.json``, checked
first) into the package (``costmodel/profiles/verify/``, what the installed cost model
reads), then updates the block in ``DIR/cost-model.md``, the serving side's handover
thresholds (``integration/handover.json``, package data: the plugin never builds a cost
model) and writes
``DIR/img/costmodel-verify.png`` (only when there is a report: nothing unmeasured is
plotted); ``--check-docs DIR`` exits 1 when the copy or the block is stale. ``nox -s docs``
runs it (``bench/harness/generated_docs.py``). Deterministic.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

from vllm_kimi_ext import facts
from vllm_kimi_ext.costmodel import verify_cost as vc
from vllm_kimi_ext.costmodel import verify_measured as vm
from vllm_kimi_ext.costmodel.acceptance import from_draft_profile
from vllm_kimi_ext.costmodel.catalog import DEFAULT_HARDWARE, load_draft
from vllm_kimi_ext.costmodel.markdown import md_table
from vllm_kimi_ext.costmodel.model import CostModel, Plan
from vllm_kimi_ext.costmodel.options import fmt_bytes

PCIE = DEFAULT_HARDWARE
BLOCK = "verify"
#: The serving side's copy of the per-step handover thresholds (package data of
#: ``integration/``, read by ``integration/verifier_choice.py`` without the cost model).
HANDOVER_DATA = Path(str(resources.files("vllm_kimi_ext.integration").joinpath(
    "handover.json")))
BATCHES = (1, 8, 32, 64)
IMG = "img/costmodel-verify.png"
#: (draft profile, k): the EAGLE-3 reference head (k = 3) and a block drafter (k = 7),
#: tp8/full vocabulary/NCCL, card acceptance (the gains do not depend on it: every verifier
#: emits the same tokens per step)
CONFIGS = (("lightseek-eagle3-mla", 3), ("zlab-dflash", 7))
MODE_WORDS = {"top_p_T1": "T=1.0, top_p 0.95", "top_p_T0.6": "T=0.6, top_p 0.95",
              "greedy": "greedy", "topk_minp": "top-k + min-p"}
#: for the caption only (never used to scale a measurement)
H200_BANDWIDTH_GBPS = 4800.0
H200_BANDWIDTH_SOURCE = "NVIDIA H200 Tensor Core GPU datasheet, HBM3e"
SHORT = vc.VERIFIER_SHORT


def markers() -> tuple[str, str]:
    return (f"<!-- BEGIN GENERATED: {BLOCK} (python -m vllm_kimi_ext.costmodel.verify_report "
            f"--write-docs docs/) -->", f"<!-- END GENERATED: {BLOCK} -->")


def _us(p: vc.VerifyPrice) -> str:
    if not p.priced:
        return vc.NOT_PRICED
    return f"{p.compute_us:.0f} + {p.comm_us:.0f} = **{p.total_us:.0f}**"


def _gain(g: float | None) -> str:
    return "-" if g is None else ("0%" if abs(g) < 5e-3 else f"{g:+.0%}")


def _plan(draft: str, k: int, batch: int) -> tuple[Plan, object]:
    d = load_draft(draft)
    return Plan(k=k, draft=d, batch=batch), from_draft_profile(d.acceptance)


def _batch_sharded_compute(meas) -> str:
    """How batch-sharded sampling's compute is taken, for what the report holds."""
    have = sum(c.batch_sharded_us is not None for c in meas.cases)
    if have == len(meas.cases):
        return ("Batch-sharded sampling's compute is its busiest rank's measured work "
                "(`batch_sharded_us`: shard plan, permute, vLLM's verify on the rows of the "
                "`ceil(B/8)` requests it owns, packed output; graph-captured).")
    lower = ("vLLM's verify alone on its busiest rank's rows (`ceil(B/8)(k+1)`), without its "
             "shard plan and pack kernels (a lower bound)")
    if have:
        return (f"Batch-sharded sampling's compute is its busiest rank's measured work "
                f"(`batch_sharded_us`) in {have} of {len(meas.cases)} cases, elsewhere {lower}.")
    return f"Batch-sharded sampling's compute is {lower}."


def _comm_only(cm: CostModel, k: int) -> list[str]:
    rows = []
    for b in BATCHES:
        s = vc.price_stock(cm, None, b, k, "top_p_T1")
        bs = vc.price_batch_sharded(cm, None, b, k, "top_p_T1")
        gathered = fmt_bytes(s.rows * cm.model.vocab_size * cm.model.dtype_bytes)
        rows.append([str(b), str(s.rows), f"{s.comm_us:.0f} us ({gathered} gathered)",
                     f"{bs.comm_us:.0f} us", vc.NOT_PRICED])
    return ["Communication alone, which the PCIe model prices without the report (k = "
            f"{k}; us per verify step):", "",
            md_table(["batch", "verified rows", "stock: 1 logits all-gather",
                      "batch-sharded: all-to-all + output all-gather",
                      "sharded (payload and rounds are measured)"], rows)]


CONFIG_HEADER = ["batch", "verified rows", "sampling", "stock us", "sharded us",
                 "batch-sharded us", "stock tok/s", "sharded vs stock", "batch-sharded vs stock"]
VERDICT_HEADER = ["sampling", "sharded vs stock", "batch-sharded vs stock",
                  "sharded vs batch-sharded", "both on runs (per step)"]


def config_rows(cm: CostModel, meas, draft: str, k: int,
                batches: tuple[int, ...] = BATCHES) -> list[list[str]]:
    """One row per Kimi sampling setting and batch: each verifier's verify step (compute +
    communication, us) and the tokens/s gain over stock end to end."""
    rows = []
    for mode in vc.KIMI_MODES:
        for b in batches:
            plan, acc = _plan(draft, k, b)
            e = vc.end_to_end(cm, plan, acc, meas, mode)
            tps = e.tokens_per_s("stock")
            rows.append([str(b), str(e.prices["stock"].rows), MODE_WORDS[mode],
                         *(_us(e.prices[v]) for v in vc.VERIFIERS),
                         "-" if tps is None else f"{tps:.0f}",
                         _gain(e.gain("sharded")), _gain(e.gain("batch_sharded"))])
    return rows


def _config_caption(draft: str, k: int) -> str:
    return (f"`{draft}`, k = {k} (tp8, full vocabulary, NCCL; the rest of the step from the "
            "fitted model):")


def verdict_rows(cm: CostModel, meas) -> list[list[str]]:
    ks = sorted({c.k for c in meas.cases}) if meas is not None else [k for _, k in CONFIGS]
    return [[f"{MODE_WORDS[mode]}, k = {k}",
             vc.verdict(cm, meas, k, mode, "sharded", "stock"),
             vc.verdict(cm, meas, k, mode, "batch_sharded", "stock"),
             vc.verdict(cm, meas, k, mode, "sharded", "batch_sharded"),
             vc.handover_words(cm, meas, k, mode)]
            for k in ks for mode in vc.MODES]


VERDICT_CAPTION = ("Where each wins end to end, per the model (every batch 1-64 whose verified "
                   "rows lie within the measured range; a shorter verify step is a faster "
                   "step, as nothing else differs); the last column is what the plugin runs "
                   "with `VLLM_KIMI_EXT_SHARDED_VERIFY=1` and `--enable-batch-sharded-sampling` "
                   "both on (a forecast, as the rest):")


def _verdicts(cm: CostModel, meas) -> list[str]:
    return ([VERDICT_CAPTION, "", "| " + " | ".join(VERDICT_HEADER) + " |",
            "|---" * len(VERDICT_HEADER) + "|"]
        + ["| " + " | ".join(r) + " |" for r in verdict_rows(cm, meas)])


def _text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    rows = [[c.replace("**", "") for c in r] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
            for r in [header, ["-" * w for w in widths], *rows]]


def verify_text(cm: CostModel, meas: vc.VerifyMeasurements | None,
                batches: tuple[int, ...] = BATCHES) -> str:
    """``vllm-kimi-ext plan --verify-cost``: the same tables as the docs block, as text."""
    if meas is None:
        out = [f"{vc.NOT_PRICED}: no measured verify-step report ({vc.REPORT_NAME}; the "
               "package copy is made by nox -s docs, or pass --verify-report FILE).", ""]
    else:
        out = [f"measured per-rank compute: {meas.source} ({meas.hardware_text()}, "
               f"{meas.date}): {meas.hardware_text()} time, a forecast input for "
               f"{cm.hw.name}, not a measurement of it; communication: PCIe collective model "
               f"({cm.latency.name}, NCCL, once per round). Cells: compute + comm = us.", ""]
    for draft, k in CONFIGS:
        out += [_config_caption(draft, k).replace("`", ""), "",
                *_text_table(CONFIG_HEADER, config_rows(cm, meas, draft, k, batches)), ""]
    out += [VERDICT_CAPTION, ""] + _text_table(VERDICT_HEADER, verdict_rows(cm, meas))
    return "\n".join(out)


def _config_table(cm: CostModel, meas, draft: str, k: int) -> list[str]:
    return [_config_caption(draft, k), "", md_table(CONFIG_HEADER, config_rows(cm, meas, draft,
                                                                                k))]


def _bandwidth_note(cm: CostModel, meas: vc.VerifyMeasurements) -> str:
    if "H200" not in meas.hardware_text():
        return ""
    return (f" (its {cm.hw.memory_bandwidth_GBps / 1e3:.2f} TB/s in the hardware profile are "
            f"{cm.hw.memory_bandwidth_GBps / H200_BANDWIDTH_GBPS:.0%} of the H200's "
            f"{H200_BANDWIDTH_GBPS / 1e3:.1f} TB/s ({H200_BANDWIDTH_SOURCE}): both verifiers' "
            "compute would be longer there)")


def verify_markdown(meas: vc.VerifyMeasurements | None, hardware: str = PCIE) -> str:
    cm = CostModel.build(hardware)
    src = f"`{vc.REPORT_NAME}`"
    head = [
        "Three verifiers of one speculative step (`vllm_kimi_ext/costmodel/verify_cost.py`): "
        f"stock vLLM 0.34.0 (all-gather of the `[B(k+1), {facts.target_dims().vocab_size}]` bf16 "
        "logits, then top-p and "
        "`rejection_sample` on every rank), this project's vocabulary-sharded verifier "
        "(`VLLM_KIMI_EXT_SHARDED_VERIFY=1`) and vLLM 0.34.0's `--enable-batch-sharded-sampling` "
        "([comparison](sharded-verification.md#batch-sharded-sampling-vllm-0340-and-sharded-"
        "verification)). Per rank: measured compute + communication from the PCIe collective "
        f"model of `{hardware}` (latency table `{cm.latency.name}`, NCCL, "
        f"+{cm.params.collective_overhead_us:.1f} us fitted in-situ overhead per collective; "
        "sources above), once per all-gather round.",
        "",
    ]
    if meas is None:
        return "\n".join(head + [
            f"**Not measured: not priced.** The measured report {src} is not in this tree, so "
            "no verify step below has a price and the recommender does not offer the sharded "
            "verifier (it is offered only where the measured numbers price it below stock "
            "under Kimi's sampling). The report comes from the graph-captured verify "
            "benchmark on one H200; `nox -s docs` prices it once it is there.", "",
            *_comm_only(cm, 3)])
    out = head + [
        f"Measured input: {src} ({meas.hardware_text()}, {meas.date}). **Compute is "
        f"{meas.hardware_text()} time** (per rank, CUDA graph, communication excluded): a "
        "forecast input for the 8x RTX PRO 6000 tables, not a measurement of an RTX PRO 6000"
        f"{_bandwidth_note(cm, meas)}. Row counts between measured ones are interpolated "
        f"linearly; outside them: {vc.NOT_PRICED}. {_batch_sharded_compute(meas)} Its "
        "all-to-all is priced as the all-gather with the same "
        "bytes received per rank (a rule: no all-to-all is measured on this box). Cells: "
        "compute + communication = verify step, us; gains in tokens/s over stock.", ""]
    for draft, k in CONFIGS:
        out += _config_table(cm, meas, draft, k) + [""]
    out += _verdicts(cm, meas) + ["", f"![verify step per batch]({IMG})"]
    return "\n".join(out)


def plot_verify(meas: vc.VerifyMeasurements, path: str | Path, hardware: str = PCIE,
                k: int = 3) -> Path:
    """Verify step per rank (measured compute + modelled PCIe communication) against the
    batch, one line per verifier and sampling setting, and a wide line for both on (the
    sharded verifier and batch-sharded sampling chosen per step); unpriced batches are left
    out."""
    from vllm_kimi_ext.costmodel.plot import _legend_right, _plt, _save

    plt = _plt()
    cm = CostModel.build(hardware)
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    colors = {"stock": "black", "sharded": "tab:blue", "batch_sharded": "tab:orange"}
    styles = {"top_p_T1": "-", "top_p_T0.6": "--"}
    batches = list(range(1, 65))
    for mode in vc.KIMI_MODES:
        pts = [(b, vc.price_both(cm, meas, b, k, mode).total_us) for b in batches]
        pts = [(b, t) for b, t in pts if t is not None]
        if pts:  # under the others: where it lies on one of them, that one is what runs
            ax.plot([b for b, _ in pts], [t for _, t in pts], linestyle=styles[mode],
                    color="tab:green", lw=5, alpha=0.3,
                    label=f"both on (chosen per step), {MODE_WORDS[mode]}")
        for v in vc.VERIFIERS:
            pts = [(b, vc.price(cm, meas, v, b, k, mode).total_us) for b in batches]
            pts = [(b, t) for b, t in pts if t is not None]
            if pts:
                ax.plot([b for b, _ in pts], [t for _, t in pts], linestyle=styles[mode],
                        color=colors[v], lw=1.4, label=f"{SHORT[v]}, {MODE_WORDS[mode]}")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2, 4, 8, 16, 32, 64])
    ax.set_xticklabels(["1", "2", "4", "8", "16", "32", "64"])
    ax.set_yscale("log")
    ax.set_xlabel(f"batch (requests; verified rows = batch x {k + 1})")
    ax.set_ylabel("verify step per rank, us (log)")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(f"k = {k}: compute measured on {meas.hardware_text()} (not an RTX PRO 6000) "
                 f"+ PCIe communication model of {hardware}", fontsize=8)
    _legend_right(ax)
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------
# docs
# ---------------------------------------------------------------------------------------------


def updated(text: str, block: str) -> str:
    begin, end = markers()
    if begin not in text or end not in text:
        raise ValueError(f"cost-model.md lacks the GENERATED {BLOCK} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def handover_json(meas: vc.VerifyMeasurements | None, hardware: str = PCIE) -> str:
    """The serving side's handover thresholds (:func:`.verify_cost.handover_table`), as
    the package data file ``integration/handover.json`` holds them."""
    table = vc.handover_table(CostModel.build(hardware), meas)
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def generated(docs_dir: Path, meas: vc.VerifyMeasurements | None) -> dict[Path, str]:
    cost = docs_dir / "cost-model.md"
    return {cost: updated(cost.read_text(), verify_markdown(meas)),
            HANDOVER_DATA: handover_json(meas)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vllm_kimi_ext.costmodel.verify_report",
                                 description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write-docs", type=Path, metavar="DIR",
                   help="update the verify block of DIR/cost-model.md and DIR/" + IMG)
    g.add_argument("--check-docs", type=Path, metavar="DIR",
                   help="exit 1 if the verify block of DIR/cost-model.md is stale")
    ap.add_argument("--report", type=Path, default=None,
                    help=f"the measured report (default {vc.REPORT_NAME})")
    args = ap.parse_args(argv)
    docs = args.write_docs or args.check_docs
    try:
        if args.report is not None:
            meas = vm.load_report(args.report)
        else:
            check = bool(args.check_docs)
            root = docs.resolve().parent
            if sync_package_copy(root / vc.REPORT_NAME, check, vm.DEFAULT_REPORT) and check:
                return 1
            meas = vc.measurements()
    except vm.VerifyReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    expected = generated(docs, meas)
    if args.check_docs:
        stale = [p for p, text in expected.items() if _text(p) != text]
        for p in stale:
            print(f"stale: {p} (run python -m vllm_kimi_ext.costmodel.verify_report "
                  f"--write-docs {docs})", file=sys.stderr)
        return 1 if stale else 0
    for p, text in expected.items():
        if _text(p) != text:
            p.write_text(text)
            print(f"wrote {p}")
    if meas is not None:
        print(f"wrote {plot_verify(meas, docs / IMG)}")
    return 0


def _text(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def sync_package_copy(report: Path, check: bool = False, dst: Path | None = None) -> bool:
    """Make the package's copy ``dst`` (default: the verify-step report's) of a measured
    report equal ``report`` (the checkout's ``bench/reports`` file), after checking it;
    with ``check``, only say whether it differs.
    Returns True when the copy is (check) or was (write) stale. Without ``report`` the
    package copy is left as it is."""
    if not report.is_file():
        return False
    vm.load_report(report)  # a malformed report is refused before anything is written
    data, dst = report.read_bytes(), (vm.DEFAULT_REPORT if dst is None else dst)
    if dst.is_file() and dst.read_bytes() == data:
        return False
    if check:
        print(f"stale: {dst} differs from {report} (run python -m "
              "vllm_kimi_ext.costmodel.verify_report --write-docs docs/)", file=sys.stderr)
        return True
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".json.tmp")
    tmp.write_bytes(data)
    tmp.replace(dst)  # atomic: a killed run leaves the old copy or the new one
    print(f"copied {report} -> {dst}")
    return True


if __name__ == "__main__":
    sys.exit(main())

"""Markdown reports from the cost model, and the command that writes the generated docs.

* :func:`markdown_report` - a plan report (tables + PNG) for one box and set of drafts; the
  bench session uses it to put the model's prediction beside its measurements.
* ``docs/what-to-run.md`` (:mod:`.what_to_run`) and the blocks between the ``GENERATED``
  markers of ``docs/cost-model.md`` (:mod:`.cost_model_doc`) and of
  ``docs/choosing-a-draft.md`` (:func:`~.answer_text.choosing_answer_markdown`).

``python -m vllm_kimi_ext.costmodel.report --write-docs DIR`` regenerates the documents
and their PNGs under ``DIR/img``; ``--check-docs DIR`` exits 1 when a document is stale
(a unit test does the same). Everything here is deterministic: no dates, no machine names.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from vllm_kimi_ext.costmodel import whatif
from vllm_kimi_ext.costmodel.acceptance import Acceptance, from_draft_profile
from vllm_kimi_ext.costmodel.answer_text import choosing_answer_markdown, headline_markdown
from vllm_kimi_ext.costmodel.calibration import validate
from vllm_kimi_ext.costmodel.catalog import list_profiles, load_draft, load_hardware
from vllm_kimi_ext.costmodel.cost_model_doc import (
    BLOCKS,
    GENERATED_BLOCKS,
    IMG,
    PCIE,
    breakdown_markdown,
    generated_markers,
)
from vllm_kimi_ext.costmodel.headline import headline, recommendation
from vllm_kimi_ext.costmodel.latency import load_latency_table
from vllm_kimi_ext.costmodel.markdown import md_table, pct  # noqa: F401 - re-exported
from vllm_kimi_ext.costmodel.model import CostModel
from vllm_kimi_ext.costmodel.options import Recommendation, describe, fmt_bytes
from vllm_kimi_ext.costmodel.plot import (
    plot_latency,
    plot_levers,
    plot_plan,
    plot_validation,
    series,
)
from vllm_kimi_ext.costmodel.recommend import recommend
from vllm_kimi_ext.costmodel.what_to_run import drafts_section_of, what_to_run_markdown
from vllm_kimi_ext.user_input import (
    EXIT_CODES_HELP,
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    UserInputError,
    bounded_int,
    one_line,
)

__all__ = ["PCIE", "generated_docs", "markdown_report", "md_table", "stale_docs",
           "what_to_run_markdown", "write_docs"]


# ---------------------------------------------------------------------------------------------
# Plan reports (bench)
# ---------------------------------------------------------------------------------------------


def _option_row(o, base_tps: float) -> list[str]:
    e, p = o.estimate, o.plan
    return [p.draft.name if p.speculative else "(no speculation)", str(p.k),
            f"{p.placement}/{p.vocab}" if p.speculative else "-",
            p.verifier if p.speculative else "-", p.backend, f"{e.tau:.2f}",
            f"{e.tokens_per_s:.1f}", f"{e.tokens_per_s / base_tps:.2f}x",
            f"{e.collectives_per_token:.1f}", fmt_bytes(e.comm_bytes_per_token),
            fmt_bytes(e.hbm_bytes_per_token)]


_HEADER = ["draft", "k", "placement", "verifier", "backend", "tau", "tok/s",
           "x stock no-spec", "collectives/token", "comm bytes/token", "HBM bytes/token"]


def plan_markdown(cm: CostModel, rec: Recommendation, plot_name: str | None = None,
                  heading: str = "Recommendation") -> str:
    base = rec.no_spec_stock.tokens_per_s
    rows = [_option_row(o, base) for o in rec.options if not o.plan.speculative]
    for _, pts in series(rec.options).items():
        rows += [_option_row(o, base) for _, o in pts]
    p = cm.params
    out = [f"Hardware `{cm.hw.name}` ({cm.hw.description}); batch {rec.batch}, context "
           f"{rec.context}; {'fitted' if p.calibrated else 'prior'} parameters "
           "([cost model](../../docs/cost-model.md)).", "", f"**{heading}**", ""]
    out += [f"- {line}" for line in rec.explanation]
    out += ["", "**Caveats**", ""] + [f"- {line}" for line in rec.caveats]
    if plot_name:
        out += ["", f"![tokens/s against draft length]({plot_name})"]
    out += ["", "**All configurations** (buildable; best verifier and backend per draft, k "
            "and placement)", "", md_table(_HEADER, rows), "",
            f"**Step breakdown of the recommendation** ({describe(rec.best.plan)})", "",
            breakdown_markdown(rec.best.estimate)]
    return "\n".join(out)


def markdown_report(out_dir: str | Path, hardware: str = PCIE, drafts: list[str] | None = None,
                    batch: int = 1, context: int = 1024,
                    acceptance: dict[str, Acceptance] | None = None,
                    name: str = "costmodel-plan", title: str | None = None) -> str:
    """Write ``<name>.md`` and ``<name>.png`` under ``out_dir``; return the markdown.

    With the defaults it is the headline's report: the one answer
    (:func:`~.headline.headline_markdown`) and the same choice explained
    (:func:`~.headline.recommendation`), every draft across its band, and the headline
    draft's configurations. Given ``drafts``, ``acceptance`` (draft name -> measured
    acceptance, overriding the cards), another batch, context or box, it is a plan for
    those inputs and says that it is not the headline."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (hardware, drafts, batch, context, acceptance) == (PCIE, None, 1, 1024, None):
        h = headline()
        rec = recommendation(h)
        png = plot_plan(rec, out_dir / f"{name}.png")
        text = (f"# {title or 'Cost-model plan'}\n\n**What to run** (the same answer as "
                f"README.md and docs/what-to-run.md):\n\n{headline_markdown(h)}\n\n"
                + plan_markdown(h.cm, rec, png.name, heading="Why this configuration")
                + "\n\n" + "\n".join(drafts_section_of(h.cm)) + "\n")
        (out_dir / f"{name}.md").write_text(text)
        return text
    cm = CostModel.build(hardware)
    pairs = []
    for dname in drafts or list_profiles("drafts"):
        d = load_draft(dname)
        acc = (acceptance or {}).get(dname) or from_draft_profile(d.acceptance)
        if acc is not None:
            pairs.append((d, acc))
    if not pairs:
        raise ValueError("no draft with an acceptance figure to report on")
    rec = recommend(cm, pairs, batch=batch, context=context)
    png = plot_plan(rec, out_dir / f"{name}.png")
    text = (f"# {title or 'Cost-model plan'}\n\n> A plan for the inputs given (drafts "
            f"{', '.join(d.name for d, _ in pairs)}; batch {batch}, context {context}, "
            f"`{hardware}`), at single acceptance figures: not the answer of "
            "README.md and docs/what-to-run.md, which ranks configurations by evidence.\n\n"
            + plan_markdown(cm, rec, png.name) + "\n")
    (out_dir / f"{name}.md").write_text(text)
    return text


# ---------------------------------------------------------------------------------------------
# docs
# ---------------------------------------------------------------------------------------------


def _with_generated_block(text: str, name: str, block: str,
                          doc: str = "docs/cost-model.md") -> str:
    begin, end = generated_markers(name)
    if begin not in text or end not in text:
        raise ValueError(f"{doc} lacks the GENERATED {name} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def generated_docs(docs_dir: str | Path) -> dict[Path, str]:
    """{path: expected content} for the generated documents under ``docs_dir``."""
    docs_dir = Path(docs_dir)
    cost = docs_dir / "cost-model.md"
    out = {docs_dir / "what-to-run.md": what_to_run_markdown()}
    choosing = docs_dir / "choosing-a-draft.md"
    if choosing.exists():
        out[choosing] = _with_generated_block(choosing.read_text(), "answer",
                                              choosing_answer_markdown(),
                                              "docs/choosing-a-draft.md")
    if cost.exists():
        text = cost.read_text()
        for name in GENERATED_BLOCKS:
            text = _with_generated_block(text, name, BLOCKS[name]())
        out[cost] = text
    return out


#: Hand-written documents that hold generated blocks: written only when they exist.
HOSTS = ("cost-model.md", "choosing-a-draft.md")


def skipped_docs(docs_dir: str | Path) -> list[Path]:
    """The documents :func:`generated_docs` leaves out because they do not exist."""
    return [Path(docs_dir) / name for name in HOSTS if not (Path(docs_dir) / name).exists()]


def write_images(img_dir: str | Path) -> list[Path]:
    img_dir = Path(img_dir)
    cm = CostModel.build(PCIE)
    h = headline()
    return [
        plot_validation(validate(cm), img_dir / "costmodel-validation.png"),
        plot_latency([load_latency_table(n) for n in list_profiles("latency")],
                     img_dir / "costmodel-latency.png"),
        plot_levers(whatif.lever_table(cm, h.draft, h.choice.band),
                    img_dir / "costmodel-levers.png"),
    ]


def write_docs(docs_dir: str | Path, images: bool = True) -> list[Path]:
    written = []
    for path, text in generated_docs(docs_dir).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    if images:
        written += write_images(Path(docs_dir) / IMG)
    return written


def stale_docs(docs_dir: str | Path) -> list[Path]:
    return [p for p, text in generated_docs(docs_dir).items()
            if not p.exists() or p.read_text() != text]


PROG = "python -m vllm_kimi_ext.costmodel.report"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 epilog=EXIT_CODES_HELP)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write-docs", type=Path, metavar="DIR",
                   help="regenerate what-to-run.md, the generated blocks of cost-model.md "
                        "and their PNGs (DIR/img)")
    g.add_argument("--check-docs", type=Path, metavar="DIR",
                   help="exit 1 if the generated documents under DIR are stale")
    g.add_argument("--report", type=Path, metavar="DIR",
                   help="write a plan report (markdown + PNG) into DIR")
    ap.add_argument("--hardware", default=PCIE, help=f"hardware profile (default {PCIE})")
    ap.add_argument("--draft", action="append", default=None,
                    help="draft profile for --report (repeat; default: the headline's report)")
    ap.add_argument("--batch", type=bounded_int(1, 4096, what="a batch size"), default=1)
    ap.add_argument("--context", type=bounded_int(0, 1 << 20, what="a context length"),
                    default=1024)
    ap.add_argument("--debug", action="store_true", help="on an error, print the traceback too")

    def one_line_error(message: str):  # argparse's usage dump would bury the reason
        print(f"{PROG}: error: {one_line(message)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)

    ap.error = one_line_error
    return ap


def _directory(flag: str, path: Path, must_exist: bool) -> None:
    """A directory argument: refused when it is a file, lies under a file, or (to check)
    does not exist."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a directory")
    if must_exist and not path.is_dir():
        raise UsageError(f"{flag} {path}: no such directory")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {path}: {parent} is a file, not a directory")
            break


def _run(args: argparse.Namespace) -> int:
    if args.write_docs:
        _directory("--write-docs", args.write_docs, must_exist=False)
        for p in write_docs(args.write_docs):
            print(f"wrote {p}")
        for p in skipped_docs(args.write_docs):
            print(f"skipped: {p} does not exist (its generated blocks live inside a "
                  "hand-written document; copy it from the repository's docs/ first)",
                  file=sys.stderr)
        return EXIT_OK
    if args.check_docs:
        _directory("--check-docs", args.check_docs, must_exist=True)
        stale = stale_docs(args.check_docs)
        for p in stale:
            print(f"stale: {p} (run {PROG} --write-docs {args.check_docs})", file=sys.stderr)
        return EXIT_FINDINGS if stale else EXIT_OK
    _directory("--report", args.report, must_exist=False)
    load_hardware(args.hardware)  # an unknown name or a bad file: one line, exit 2
    if args.draft:
        for name in args.draft:
            d = load_draft(name)  # an unknown name or a bad file: one line, exit 2
            if from_draft_profile(d.acceptance) is None:
                raise UsageError(f"--draft {name}: publishes no acceptance figure to report on")
    try:
        markdown_report(args.report, args.hardware, args.draft, args.batch, args.context)
    except ValueError as exc:  # nothing fits in memory at this batch and context
        if isinstance(exc, UserInputError):
            raise
        raise UsageError(f"--batch {args.batch} --context {args.context}: {exc}") from None
    print(f"wrote {args.report}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """The command line, under the package's exit-code contract (0 clean, 1 stale documents,
    2 usage or unreadable input: one line on stderr, never a traceback unless --debug)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a refusal already printed (2)
        return EXIT_OK if exc.code in (None, 0) else EXIT_USAGE
    try:
        return _run(args)
    except Exception as exc:  # noqa: BLE001 - the contract: one line, never a bare traceback
        if args.debug:
            traceback.print_exc()
        if isinstance(exc, UserInputError):
            msg = f"error: {exc}"
        elif isinstance(exc, OSError):
            msg = f"error: cannot access {exc.filename or ''}: {exc.strerror or exc}"
        else:
            msg = (f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the "
                   "traceback and report it)")
        print(f"{PROG}: {one_line(msg)}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

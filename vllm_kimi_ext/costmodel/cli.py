"""``vllm-kimi-ext plan``: what to run, according to the cost model.

Examples::

    vllm-kimi-ext plan --list
    vllm-kimi-ext plan --draft lightseek-eagle3-mla
    vllm-kimi-ext plan --draft lightseek-eagle3 --tau 2.9 --batch 4 --out plan.png --json plan.json
    vllm-kimi-ext plan --draft nvidia-eagle3 --acceptance 0.7,0.5,0.4
    vllm-kimi-ext plan --draft lightseek-eagle3 --acceptance-from bench/out/e2e/results.json
    vllm-kimi-ext plan --validate

Exit codes: 0 clean; 1 ``--validate`` found a point beyond the error bound without a named
mechanism; 2 usage or unreadable input (one line naming the argument or the file and the
field; ``--debug`` shows the traceback of an unexpected error).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from vllm_kimi_ext.costmodel.catalog import DEFAULT_HARDWARE
from vllm_kimi_ext.jsonsafe import strict
from vllm_kimi_ext.user_input import EXIT_FINDINGS, EXIT_OK, UsageError, one_line_errors

__all__ = ["DEFAULT_HARDWARE", "strict"]
DEFAULT_MODEL = "kimi-k2.5"
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _finite(name: str, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{name} must be finite, got {text!r}")
        if lo is not None and (v <= lo if lo_open else v < lo):
            raise argparse.ArgumentTypeError(
                f"{name} must be {'>' if lo_open else '>='} {lo:g}, got {text!r}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"{name} must be <= {hi:g}, got {text!r}")
        return v
    return parse


def _int(name: str, lo: int, hi: int | None = None):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"within {lo}..{hi}"
            raise argparse.ArgumentTypeError(f"{name} must be {rng}, got {text!r}")
        return v
    return parse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="recommend a speculative-decoding configuration from the PCIe cost model",
        description="Estimate decode throughput of Kimi-K2.5 with speculative decoding on a "
        "box (a model fitted to public measurements, not a measurement of your box) and "
        "recommend draft length, placement, vocabulary, verifier and all-reduce backend "
        "among what stock vLLM 0.34.0 plus this project can build.",
        epilog="exit codes: 0 clean; 1 --validate found an unexplained miss; 2 usage or "
        "unreadable input (never a traceback; --debug shows one).")
    p.add_argument("--list", action="store_true", help="list the shipped profiles and exit")
    p.add_argument("--validate", action="store_true",
                   help="print every calibration and held-out point: measured, predicted, error")
    p.add_argument("--hardware", default=DEFAULT_HARDWARE,
                   help=f"hardware profile name or JSON path (default {DEFAULT_HARDWARE})")
    p.add_argument("--latency", default=None,
                   help="latency table name or JSON path (default: the hardware profile's; "
                   "e.g. one written by bench/allreduce_bench.py)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"model profile name or JSON path (default {DEFAULT_MODEL})")
    p.add_argument("--draft", action="append", default=[],
                   help="draft profile name, the draft's checkpoint (as in --speculative-config) "
                   "or a profile JSON path; repeat for several (default: every draft with a "
                   "card acceptance figure; --list shows them)")
    acc = p.add_mutually_exclusive_group()
    acc.add_argument("--acceptance", metavar="R1,R2,...",
                     help="per-position acceptance rates as vLLM logs them (fraction of steps "
                     "in which position i was accepted; non-increasing, within [0, 1])")
    acc.add_argument("--tau", type=_finite("--tau", lo=1.0),
                     help="mean acceptance length (bonus token included) measured at --tau-k")
    acc.add_argument("--acceptance-from", type=Path, metavar="RESULTS_JSON",
                     help="per-position acceptance of a bench/e2e/runner.py results.json")
    p.add_argument("--acceptance-run", default=None,
                   help="with --acceptance-from: the run id when the file holds several runs "
                   "of the --draft given (default: the one run of that draft)")
    p.add_argument("--acceptance-any-draft", action="store_true",
                   help="with --acceptance-from: apply the run's acceptance even to a --draft "
                   "other than the draft it measured (refused otherwise: acceptance belongs "
                   "to one draft on one target)")
    p.add_argument("--tau-k", type=_int("--tau-k", 1, 15), default=None,
                   help="draft tokens at which --tau was measured (default: the draft's "
                   "reference k, else 3)")
    p.add_argument("--dataset", default=None,
                   help="which card figure to use (e.g. mt-bench, gsm8k, humaneval)")
    p.add_argument("--batch", type=_int("--batch", 1, 4096), default=1,
                   help="concurrent requests (default 1)")
    p.add_argument("--context", type=_int("--context", 0, 1 << 20), default=1024,
                   help="context tokens per request (default 1024)")
    p.add_argument("--backend", action="append", default=None,
                   help="restrict all-reduce backends (repeat); default: every costed one")
    p.add_argument("--k-max", type=_int("--k-max", 1, 7), default=7,
                   help="largest draft length tried (1..7)")
    p.add_argument("--stock-only", action="store_true",
                   help="only what stock vLLM 0.34 can run")
    p.add_argument("--params", choices=("calibrated", "prior"), default="calibrated",
                   help="the fitted parameters (default) or the hardware profile's priors")
    p.add_argument("--count-mode", choices=("profile", "code"), default="profile",
                   help="'profile': 123 all-reduces per pass + 4 unattributed per step; "
                   "'code': the 123 counted from code")
    p.add_argument("--routing-skew", type=_finite("--routing-skew", lo=1.0),
                   help="override the fitted correlation of one sequence's verified tokens "
                   "(>= 1; 1 = independent)")
    p.add_argument("--all", action="store_true",
                   help="print every verifier/backend combination, not just the best per row")
    p.add_argument("--out", type=Path,
                   help="write a plot of tokens/s against k (.png, .svg or .pdf)")
    p.add_argument("--json", type=Path, help="write the recommendation and all rows as JSON")
    p.add_argument("--verify-cost", action="store_true",
                   help="print the verify step of stock vLLM, the vocabulary-sharded verifier "
                   "and vLLM's --enable-batch-sharded-sampling at batch 1, 8, 32, 64 (and "
                   "--batch) with Kimi's sampling, priced from the measured per-rank report "
                   "('not measured: not priced' without it), and from which batch each wins")
    p.add_argument("--verify-report", type=Path, metavar="REPORT_JSON",
                   help="with --verify-cost: the measured report to price from (default: the "
                   "package's copy of bench/reports/verify_graph_vs_vllm_h200.json)")
    p.set_defaults(func=run_plan)
    one_line_errors(p)


def check_output_path(flag: str, path: Path | None, suffixes: tuple[str, ...]) -> None:
    """A writable output file: the right suffix, not a directory, no file among its parents."""
    if path is None:
        return
    if path.suffix.lower() not in suffixes:
        raise UsageError(f"{flag} {path}: the suffix must be one of {', '.join(suffixes)} "
                         "(it selects the format written)")
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {path}: {parent} is a file, not a directory")
            break


def list_profiles_text() -> str:
    from vllm_kimi_ext.costmodel.catalog import list_profiles, load_draft, load_hardware

    lines = ["hardware:"]
    for name in list_profiles("hardware"):
        hw = load_hardware(name)
        fitted = "fitted" if hw.calibration.get("fitted") else "priors only"
        lines.append(f"  {name:30s} {hw.description} [{fitted}]")
    lines.append("models:")
    lines += [f"  {name}" for name in list_profiles("models")]
    lines.append("drafts:")
    for name in list_profiles("drafts"):
        d = load_draft(name)
        a = d.acceptance or {}
        if a.get("values"):
            vals = ", ".join(f"{k} {v:g}" for k, v in sorted(a["values"].items()))
            acc = f"card {a['metric'].replace('_', ' ')} at k={a['k_ref']}: {vals}"
            if a.get("field"):
                acc += f"; {len(a['field'])} field figure(s)"
        elif a.get("assumed"):
            acc = "assumed band (nothing published)"
        else:
            acc = "no published acceptance (pass --tau/--acceptance)"
        lines.append(f"  {name:30s} {d.checkpoint} - {d.kind}; {acc}")
    lines.append("latency tables:")
    lines += [f"  {name}" for name in list_profiles("latency")]
    return "\n".join(lines)


def parse_rates(text: str) -> list[float]:
    parts = [x.strip() for x in text.split(",")]
    if not parts or any(not x for x in parts):
        raise UsageError(f"--acceptance {text!r}: expected comma-separated rates, e.g. "
                         "0.7,0.5,0.4")
    rates = []
    for x in parts:
        try:
            r = float(x)
        except ValueError:
            raise UsageError(f"--acceptance: {x!r} is not a number") from None
        if not math.isfinite(r) or not 0.0 <= r <= 1.0:
            raise UsageError(f"--acceptance: every rate must be within [0, 1], got {x!r}")
        rates.append(r)
    if any(b > a + 1e-12 for a, b in zip(rates, rates[1:])):
        raise UsageError(f"--acceptance {text!r}: per-position rates must not increase "
                         "(position i is accepted only when position i-1 was)")
    return rates


def resolve_acceptances(args, drafts):
    """[(draft, Acceptance)] from the flags or the drafts' card figures."""
    from vllm_kimi_ext.costmodel.acceptance import (
        Acceptance,
        from_results_json,
        mean_field_to_card_ratio,
        point_for,
        results_draft,
    )
    from vllm_kimi_ext.costmodel.catalog import list_profiles, load_draft

    everything = [load_draft(n) for n in list_profiles("drafts")]

    if args.acceptance_from is not None:
        try:
            shared, run_id = from_results_json(args.acceptance_from, args.acceptance_run,
                                               [d.checkpoint for d in drafts])
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        check_measured_draft(args, drafts, results_draft(args.acceptance_from, run_id), run_id)
    out = []
    for d in drafts:
        if args.acceptance:
            acc = Acceptance.from_per_position(parse_rates(args.acceptance), "--acceptance")
        elif args.tau is not None:
            k_ref = args.tau_k or (d.acceptance or {}).get("k_ref", 3)
            if args.tau > k_ref + 1:
                raise UsageError(f"--tau {args.tau:g}: impossible with {k_ref} draft tokens "
                                 f"(at most {k_ref + 1}; set --tau-k)")
            acc = Acceptance.from_tau(args.tau, int(k_ref), f"--tau {args.tau:g} at k={k_ref}")
        elif args.acceptance_from is not None:
            acc = shared
        else:
            try:
                acc = point_for(d, args.dataset, mean_field_to_card_ratio(everything))
            except KeyError as exc:
                raise UsageError(f"--dataset: draft {d.name}: {exc.args[0]}") from None
            if acc is None:
                raise UsageError(f"draft {d.name} publishes no acceptance figure; pass --tau, "
                                 "--acceptance or --acceptance-from")
        out.append((d, acc))
    return out


def check_measured_draft(args, drafts, measured: str | None, run_id: str) -> None:
    """--acceptance-from applies one run's acceptance: refuse it for any other draft unless
    --acceptance-any-draft says so."""
    from vllm_kimi_ext.costmodel.acceptance import same_draft

    if args.acceptance_any_draft:
        return
    where = f"--acceptance-from {args.acceptance_from}: run {run_id!r}"
    if not args.draft:
        raise UsageError(f"{where}: name the draft the run measured with --draft (its "
                         "acceptance applies to that draft only)")
    if measured is None:
        raise UsageError(f"{where} records no draft model (field "
                         "'speculative_config.model'); pass --acceptance-any-draft to apply it "
                         f"to --draft {', '.join(d.name for d in drafts)} anyway")
    other = [d for d in drafts if not same_draft(measured, d.checkpoint)]
    if other:
        d = other[0]
        raise UsageError(f"{where} measured draft {measured!r}, not --draft {d.name} "
                         f"({d.checkpoint or 'no checkpoint'}); name that draft with --draft, "
                         "or pass --acceptance-any-draft to apply it anyway")


def _check_args(args) -> None:
    if args.tau_k is not None and args.tau is None:
        raise UsageError("--tau-k needs --tau")
    if args.acceptance_run is not None and args.acceptance_from is None:
        raise UsageError("--acceptance-run needs --acceptance-from")
    if args.acceptance_any_draft and args.acceptance_from is None:
        raise UsageError("--acceptance-any-draft needs --acceptance-from")

    check_output_path("--out", args.out, PLOT_SUFFIXES)
    check_output_path("--json", args.json, (".json",))


def run_plan(args) -> int:
    """The ``plan`` handler; errors follow :func:`vllm_kimi_ext.cli.run_handler`'s contract."""
    if args.list:
        check_mode_args(args, "list")
        print(list_profiles_text())
        return EXIT_OK
    _check_args(args)
    if args.verify_report is not None and not args.verify_cost:
        raise UsageError("--verify-report needs --verify-cost")
    if args.validate:
        check_mode_args(args, "validate")
        return _run_validate(args)
    if args.verify_cost:
        check_mode_args(args, "verify_cost")
        return _run_verify_cost(args)
    return _run(args)


#: Flags that select or weigh configurations, with their defaults; a mode that does not
#: read one refuses it instead of ignoring it (:func:`check_mode_args`).
SELECTION_DEFAULTS = {"draft": [], "acceptance": None, "tau": None, "tau_k": None,
                      "acceptance_from": None, "acceptance_run": None,
                      "acceptance_any_draft": False, "dataset": None, "batch": 1,
                      "context": 1024, "backend": None, "k_max": 7, "stock_only": False,
                      "all": False, "verify_cost": False, "verify_report": None,
                      "validate": False, "out": None, "json": None, "hardware": DEFAULT_HARDWARE,
                      "latency": None, "model": DEFAULT_MODEL, "params": "calibrated",
                      "count_mode": "profile", "routing_skew": None}
#: mode -> (what it does, the flags it reads).
MODES = {
    "list": ("--list prints the shipped profiles", {"list"}),
    "validate": ("--validate predicts every public point at its own draft, acceptance, batch "
                 "and context", {"validate", "hardware", "latency", "model", "params",
                                 "count_mode", "routing_skew", "json", "out"}),
    "verify_cost": ("--verify-cost prices the verify step at batch 1, 8, 32, 64 and --batch",
                    {"verify_cost", "verify_report", "hardware", "latency", "model", "params",
                     "count_mode", "routing_skew", "batch"}),
}


def check_mode_args(args, mode: str) -> None:
    """Refuse flags ``mode`` would silently ignore, naming them and what it reads."""
    what, reads = MODES[mode]
    given = [k for k, default in SELECTION_DEFAULTS.items()
             if k not in reads and getattr(args, k) != default]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        takes = ", ".join("--" + k.replace("_", "-") for k in sorted(reads)
                          if k != mode) or "nothing else"
        raise UsageError(f"{what}; it would ignore {flags}: drop them (it reads {takes})")


def _run_verify_cost(args) -> int:
    from vllm_kimi_ext.costmodel import verify_cost
    from vllm_kimi_ext.costmodel import verify_measured as vm
    from vllm_kimi_ext.costmodel.verify_report import BATCHES, verify_text

    cm, _ = _build(args)
    meas = (vm.load_report(args.verify_report) if args.verify_report is not None
            else verify_cost.measurements())
    batches = BATCHES if args.batch in BATCHES else tuple(sorted((*BATCHES, args.batch)))
    print(verify_text(cm, meas, batches))
    return EXIT_OK


def _build(args):
    import dataclasses

    from vllm_kimi_ext.costmodel.catalog import load_hardware, load_model
    from vllm_kimi_ext.costmodel.model import CostModel

    hw = load_hardware(args.hardware)
    model = load_model(args.model)
    cm = CostModel.build(hw, model, params=args.params, count_mode=args.count_mode,
                         latency=args.latency)
    if args.routing_skew is not None:
        cm = cm.with_params(dataclasses.replace(cm.params, routing_skew=args.routing_skew))
    from vllm_kimi_ext.costmodel.headline import card_drafts

    drafts = [resolve_draft(n) for n in args.draft] if args.draft else card_drafts()
    if args.dataset and not any(args.dataset in d.datasets() for d in drafts):
        raise UsageError(f"--dataset {args.dataset!r}: no selected draft has it; available: "
                         + ", ".join(sorted({ds for d in drafts for ds in d.datasets()})))
    if args.backend:
        unknown = [b for b in args.backend if b not in cm.backends]
        if unknown:
            raise UsageError(f"--backend {unknown[0]!r}: not costed on {hw.name} with latency "
                             f"table {cm.latency.name}; valid: {', '.join(cm.backends)}")
        check_backends(args, cm)
    return cm, drafts


def resolve_draft(name: str):
    """A ``--draft``: a shipped profile's name, a shipped draft's checkpoint (e.g.
    ``lightseekorg/kimi-k2.5-eagle3-mla``), or a profile JSON file."""
    from pathlib import Path

    from vllm_kimi_ext.costmodel.catalog import list_profiles, load_draft

    names = list_profiles("drafts")
    if name in names:
        return load_draft(name)
    by_checkpoint = {load_draft(n).checkpoint.lower(): n for n in names}
    if name.rstrip("/").lower() in by_checkpoint:
        return load_draft(by_checkpoint[name.rstrip("/").lower()])
    if name.endswith(".json") or Path(name).is_file():
        return load_draft(name)  # a profile file (a missing .json: "no such ... file")
    raise UsageError(f"--draft {name}: unknown draft profile {name!r} (neither a profile name, "
                     f"a shipped draft's checkpoint nor a profile .json file); valid: "
                     f"{', '.join(names)}; `vllm-kimi-ext plan --list` lists each with its "
                     "checkpoint (e.g. lightseek-eagle3-mla = lightseekorg/kimi-k2.5-eagle3-mla)")


def _given_acceptance(args) -> bool:
    return bool(args.acceptance or args.tau is not None or args.acceptance_from)


def check_backends(args, cm) -> None:
    """Refuse a --backend the recommender cannot offer, with the real reason: it is costed
    (the what-if table prices it) but neither stock vLLM 0.34.0 nor this project builds it
    (or, with --stock-only, it is not stock)."""
    runnable = [b for b in cm.backends if cm.hw.backends.get(b, {}).get(
        "stock" if args.stock_only else "buildable", False)]
    for b in args.backend:
        if b not in runnable:
            spec = cm.hw.backends.get(b, {})
            raise UsageError(
                f"--backend {b}: costed for the what-if table only, not something "
                + ("stock vLLM 0.34.0 runs" if args.stock_only else
                   "stock vLLM 0.34.0 or this project can build")
                + f" ({spec.get('requires', 'not buildable')}); choose from: "
                + (", ".join(runnable) or "none"))


def _headline_inputs(args) -> bool:
    """Whether ``plan`` runs on the README answer's inputs."""
    return (not args.draft and not _given_acceptance(args) and args.dataset is None
            and args.batch == 1 and args.context == 1024 and not args.backend
            and args.k_max == 7 and not args.stock_only and args.params == "calibrated"
            and args.count_mode == "profile" and args.routing_skew is None
            and args.hardware == DEFAULT_HARDWARE and args.model == DEFAULT_MODEL
            and args.latency is None)


def _run(args) -> int:
    from vllm_kimi_ext.costmodel.answer_text import answer_line, format_answer
    from vllm_kimi_ext.costmodel.headline import answer

    cm, drafts = _build(args)
    drafts_acc = resolve_acceptances(args, drafts)
    try:
        a = answer(cm, drafts, batch=args.batch, context=args.context,
                   acceptance=(dict((d.name, acc) for d, acc in drafts_acc)
                               if _given_acceptance(args) else None),
                   dataset=args.dataset, backends=args.backend, k_max=args.k_max,
                   stock_only=args.stock_only)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    rec = a.rec
    print(answer_line(a) + ("" if _headline_inputs(args) else
                            " [for the inputs given; the README's answer: vllm-kimi-ext plan]"))
    print()
    _print_plan(args, cm, rec, drafts_acc)
    print()
    print(format_answer(a))
    if args.out:
        from vllm_kimi_ext.costmodel.plot import plot_plan

        print(f"plot: {plot_plan(rec, args.out)}")
    if args.json:
        _write_json(args, cm, rec, drafts_acc, a)
    return EXIT_OK


def _print_plan(args, cm, rec, drafts_acc) -> None:
    from vllm_kimi_ext.costmodel.tables import format_table

    p = cm.params
    print(f"{cm.hw.name}: {cm.hw.description}")
    print(f"model {cm.model.name}; latency table {cm.latency.name}; batch {args.batch}, "
          f"context {args.context}; {'fitted' if p.calibrated else 'prior'} parameters "
          f"(vllm-kimi-ext plan --validate shows the fit); all-reduces counted per "
          f"'{args.count_mode}' mode")
    for d, a in drafts_acc:
        print(f"acceptance {d.name}: {a.source}; tau(k=1..7) = "
              + ", ".join(f"{a.tau(k):.2f}" for k in range(1, 8)))
    print()
    print(format_table(rec, show_all=args.all))
    print()
    for line in rec.explanation:
        print(f"- {line}")
    if rec.best.plan.speculative:
        from vllm_kimi_ext.costmodel.answer_text import public_status

        print(f"- Evidence: {public_status(rec.best.plan)}")
    for line in rec.caveats:
        print(f"! {line}")


def _run_validate(args) -> int:
    from vllm_kimi_ext.costmodel.calibration import validate
    from vllm_kimi_ext.costmodel.tables import format_validation

    cm, _ = _build(args)
    rep = validate(cm)
    print(format_validation(rep))
    if args.json:
        write_json(args.json, rep.to_dict())
        print(f"json: {args.json}")
    if args.out:
        from vllm_kimi_ext.costmodel.plot import plot_validation

        print(f"plot: {plot_validation(rep, args.out)}")
    return EXIT_FINDINGS if rep.unexplained_misses else EXIT_OK


def _write_json(args, cm, rec, drafts_acc, a) -> None:
    import dataclasses

    from vllm_kimi_ext.costmodel.answer_text import answer_dict

    doc = {
        "answer": answer_dict(a),
        **rec.to_dict(),
        "params": dataclasses.asdict(cm.params),
        "latency_table": cm.latency.name,
        "count_mode": args.count_mode,
        "acceptance": {d.name: {"source": a.source, "tau": {k: a.tau(k) for k in range(0, 8)}}
                       for d, a in drafts_acc},
        "rows": [{**o.estimate.to_dict(), "requires": [str(r) for r in o.requires]}
                 for o in rec.options],
    }
    write_json(args.json, doc)
    print(f"json: {args.json}")


def write_json(path: Path, doc) -> None:
    """Strict JSON (``allow_nan=False``), written to a temporary file beside ``path`` and
    renamed into place: an interrupted run leaves the old file."""
    text = json.dumps(strict(doc), indent=1, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)

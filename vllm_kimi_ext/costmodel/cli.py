"""``vllm-kimi-ext plan``: what to run, according to the cost model.

Examples::

    vllm-kimi-ext plan --list
    vllm-kimi-ext plan --hardware rtx-pro-6000-pcie-x8 --draft lightseek-eagle3
    vllm-kimi-ext plan --draft lightseek-eagle3 --tau 2.9 --batch 4 --out plan.png --json plan.json
    vllm-kimi-ext plan --draft nvidia-eagle3 --acceptance 0.7,0.5,0.4
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DEFAULT_HARDWARE = "rtx-pro-6000-pcie-x8"
DEFAULT_MODEL = "kimi-k2.5"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="recommend a speculative-decoding configuration from the PCIe cost model",
        description="Estimate decode throughput of Kimi-K2.5 with speculative decoding on a "
        "box (a model calibrated on published figures, not a measurement) and recommend "
        "draft length, draft placement, draft vocabulary, verifier and all-reduce backend.",
    )
    p.add_argument("--list", action="store_true", help="list the shipped profiles and exit")
    p.add_argument("--hardware", default=DEFAULT_HARDWARE,
                   help=f"hardware profile name or JSON path (default {DEFAULT_HARDWARE})")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"model profile name or JSON path (default {DEFAULT_MODEL})")
    p.add_argument("--draft", action="append", default=[],
                   help="draft profile name or JSON path; repeat for several "
                   "(default: every draft with published acceptance)")
    acc = p.add_mutually_exclusive_group()
    acc.add_argument("--acceptance", metavar="R1,R2,...",
                     help="per-position acceptance rates as vLLM logs them (fraction of steps "
                     "in which position i was accepted; non-increasing); overrides the "
                     "drafts' reported figures")
    acc.add_argument("--tau", type=float,
                     help="mean acceptance length (bonus token included) measured at "
                     "--tau-k draft tokens; overrides the drafts' reported figures")
    p.add_argument("--tau-k", type=int, default=None,
                   help="draft tokens at which --tau was measured (default: the draft's "
                   "reference k, else 3)")
    p.add_argument("--dataset", default=None,
                   help="which reported acceptance to use (e.g. mt-bench, gsm8k, humaneval)")
    p.add_argument("--batch", type=int, default=1, help="concurrent requests (default 1)")
    p.add_argument("--context", type=int, default=1024,
                   help="context tokens per request (default 1024)")
    p.add_argument("--backend", action="append", default=None,
                   help="restrict all-reduce backends (repeat); default: all on the box")
    p.add_argument("--k-max", type=int, default=7, help="largest draft length tried (<= 7)")
    p.add_argument("--stock-only", action="store_true",
                   help="only what stock vLLM 0.34 can run")
    p.add_argument("--params", choices=("calibrated", "prior"), default="calibrated",
                   help="fitted parameters (default) or the hardware profile's priors")
    p.add_argument("--count-mode", choices=("profile", "code"), default="profile",
                   help="'profile': 123 all-reduces per pass + 4 unattributed per step "
                   "(= the 127 a public profile reported); 'code': the 123 counted from code")
    p.add_argument("--routing-skew", type=float, default=None,
                   help="override the model profile's routing skew (1 = uniform routing)")
    p.add_argument("--all", action="store_true",
                   help="print every verifier/backend combination, not just the best per row")
    p.add_argument("--out", type=Path, help="write a PNG plot of tokens/s against k")
    p.add_argument("--json", type=Path, help="write the recommendation and all rows as JSON")
    p.set_defaults(func=run_plan)


def _err(msg: str) -> int:
    print(f"vllm-kimi-ext plan: error: {msg}", file=sys.stderr)
    return 2


def list_profiles_text() -> str:
    from vllm_kimi_ext.costmodel.catalog import list_profiles, load_draft, load_hardware

    lines = ["hardware:"]
    for name in list_profiles("hardware"):
        hw = load_hardware(name)
        n = len(hw.published)
        lines.append(f"  {name:28s} {hw.description} "
                     f"[{f'calibrated on {n} published figures' if n else 'priors only'}]")
    lines.append("models:")
    lines += [f"  {name}" for name in list_profiles("models")]
    lines.append("drafts:")
    for name in list_profiles("drafts"):
        d = load_draft(name)
        if d.acceptance:
            a = d.acceptance
            vals = ", ".join(f"{k} {v:g}" for k, v in sorted(a["values"].items()))
            acc = f"{a['metric'].replace('_', ' ')} at k={a['k_ref']}: {vals}"
        else:
            acc = "no published acceptance (pass --tau/--acceptance)"
        lines.append(f"  {name:28s} {d.checkpoint} - {d.kind}; {acc}")
    lines.append("latency tables:")
    lines += [f"  {name}" for name in list_profiles("latency")]
    return "\n".join(lines)


def resolve_acceptances(args, drafts):
    """[(draft, Acceptance)] from the flags or the drafts' reported figures."""
    from vllm_kimi_ext.costmodel.acceptance import Acceptance, from_draft_profile

    out = []
    for d in drafts:
        if args.acceptance:
            rates = [float(x) for x in args.acceptance.split(",") if x.strip()]
            acc = Acceptance.from_per_position(rates, "--acceptance")
        elif args.tau is not None:
            k_ref = args.tau_k or (d.acceptance or {}).get("k_ref", 3)
            acc = Acceptance.from_tau(args.tau, int(k_ref), f"--tau {args.tau:g} at k={k_ref}")
        else:
            try:
                acc = from_draft_profile(d.acceptance, args.dataset)
            except KeyError as exc:
                raise ValueError(f"draft {d.name}: {exc.args[0]}") from None
            if acc is None:
                raise ValueError(f"draft {d.name} publishes no acceptance figure; "
                                 "pass --tau or --acceptance")
        out.append((d, acc))
    return out


def format_table(rec, show_all: bool = False) -> str:
    from vllm_kimi_ext.costmodel.plot import series
    from vllm_kimi_ext.costmodel.recommend import _fmt_bytes

    base = {o.plan.backend: o for o in rec.options if not o.plan.speculative}
    head = (f"{'draft':22s} {'k':>2s} {'placement':11s} {'verifier':8s} {'backend':19s} "
            f"{'tau':>5s} {'tok/s':>7s} {'x no-spec':>9s} {'coll/tok':>8s} {'comm/tok':>9s} "
            f"{'HBM/tok':>8s}")
    lines = [head, "-" * len(head)]

    def row(o, name, k, placement):
        e = o.estimate
        mark = " *" if o is rec.best else ""
        sp = e.tokens_per_s / base[o.plan.backend].tokens_per_s
        return (f"{name:22s} {k:>2d} {placement:11s} "
                f"{(o.plan.verifier if o.plan.speculative else '-'):8s} {o.plan.backend:19s} "
                f"{e.tau:5.2f} {e.tokens_per_s:7.1f} {sp:8.2f}x {e.collectives_per_token:8.1f} "
                f"{_fmt_bytes(e.comm_bytes_per_token):>9s} {_fmt_bytes(e.hbm_bytes_per_token):>8s}"
                f"{mark}")

    for o in sorted(base.values(), key=lambda o: -o.tokens_per_s):
        lines.append(row(o, "(no speculation)", 0, "-"))
    if show_all:
        spec = sorted((o for o in rec.options if o.plan.speculative),
                      key=lambda o: (o.plan.draft.name, o.plan.k, o.plan.placement,
                                     o.plan.vocab, -o.tokens_per_s))
        for o in spec:
            lines.append(row(o, o.plan.draft.name, o.plan.k, f"{o.plan.placement}/{o.plan.vocab}"))
    else:
        for (draft, placement, vocab), pts in series(rec.options).items():
            for k, o in pts:
                # the recommended option stands in for its row so the marker shows
                if (rec.best.plan.speculative and rec.best.plan.draft.name == draft
                        and rec.best.plan.k == k and rec.best.plan.placement == placement
                        and rec.best.plan.vocab == vocab):
                    o = rec.best
                lines.append(row(o, draft, k, f"{placement}/{vocab}"))
    lines.append("  * recommended. x no-spec: against no speculation on the same all-reduce "
                 "backend. comm/tok: collective payload (all-reduce buffers, gathered outputs) "
                 "per output token; HBM/tok: bytes each GPU streams per output token.")
    return "\n".join(lines)


def run_plan(args) -> int:
    import dataclasses

    from vllm_kimi_ext.costmodel.catalog import (
        UnknownProfileError,
        list_profiles,
        load_draft,
        load_hardware,
        load_model,
    )
    from vllm_kimi_ext.costmodel.model import CostModel
    from vllm_kimi_ext.costmodel.recommend import recommend

    if args.list:
        print(list_profiles_text())
        return 0
    try:
        hw = load_hardware(args.hardware)
        model = load_model(args.model)
        names = args.draft or [n for n in list_profiles("drafts") if load_draft(n).acceptance]
        drafts = [load_draft(n) for n in names]
    except UnknownProfileError as exc:
        return _err(str(exc))
    if args.routing_skew is not None:
        if args.routing_skew <= 0:
            return _err("--routing-skew must be positive")
        model = dataclasses.replace(model, routing_skew=args.routing_skew)
    if args.batch < 1 or args.context < 0 or not 1 <= args.k_max <= 7:
        return _err("--batch must be >= 1, --context >= 0 and --k-max within 1..7")
    try:
        drafts_acc = resolve_acceptances(args, drafts)
    except ValueError as exc:
        return _err(str(exc))
    cm = CostModel.build(hw, model, params=args.params, count_mode=args.count_mode)
    if args.backend:
        unknown = [b for b in args.backend if b not in cm.backends]
        if unknown:
            return _err(f"unknown backend {unknown[0]!r} on {hw.name}; valid: "
                        f"{', '.join(cm.backends)}")
    try:
        rec = recommend(cm, drafts_acc, batch=args.batch, context=args.context,
                        backends=args.backend, k_max=args.k_max, stock_only=args.stock_only)
    except ValueError as exc:
        return _err(str(exc))

    p = cm.params
    print(f"{hw.name}: {hw.description}")
    print(f"model {model.name}; batch {args.batch}, context {args.context}; "
          f"bandwidth fraction {p.bandwidth_efficiency:.3f}, in-situ collective overhead "
          f"{p.collective_overhead_us:.1f} us ({'calibrated' if p.calibrated else 'priors'}); "
          f"all-reduces counted per '{args.count_mode}' mode")
    for d, a in drafts_acc:
        print(f"acceptance {d.name}: {a.source}; tau(k=1..7) = "
              + ", ".join(f"{a.tau(k):.2f}" for k in range(1, 8)))
    print()
    print(format_table(rec, show_all=args.all))
    print()
    for line in rec.explanation:
        print(f"- {line}")
    for line in rec.caveats:
        print(f"! {line}")
    if args.out:
        from vllm_kimi_ext.costmodel.plot import plot_plan

        print(f"plot: {plot_plan(rec, args.out)}")
    if args.json:
        doc = {
            **rec.to_dict(),
            "params": dataclasses.asdict(p),
            "count_mode": args.count_mode,
            "acceptance": {d.name: {"source": a.source,
                                    "tau": {k: a.tau(k) for k in range(0, 8)}}
                           for d, a in drafts_acc},
            "rows": [{**o.estimate.to_dict(), "requires": list(o.requires)}
                     for o in rec.options],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"json: {args.json}")
    return 0

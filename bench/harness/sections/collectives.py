"""Section ``collectives`` (any machine): collectives of a target pass and of draft passes,
counted in gloo TP=2 runs of tiny Kimi-shaped checkpoints (the rank function is
:mod:`.collectives_rank`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.harness.common import first_line, fmt_bytes, md_table, scrub
from bench.harness.sections.base import Context, Outcome
from bench.harness.sections.collectives_rank import (
    KIMI,
    KIMI_TP,
    bench_rank,
    draft_scenarios_usable,
)


def needs_collectives(caps: dict, ctx: Context) -> str | None:
    if not caps.get("vllm_importable"):
        return "vLLM not importable (nox -s apply-patches)"
    return None


def _draft_cases(ckpt: Path, quick: bool) -> tuple[list, dict[str, str], list[tuple[str, str]]]:
    ok, why = draft_scenarios_usable()
    if not ok:
        return [], {}, [("draft passes", why)]
    if quick:
        return [], {}, [("draft passes", "--quick")]
    from testkit import draft_scenarios as ds
    from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3

    target = TinyKimiSpec()
    cases, placements, skipped = [], {}, []
    write_tiny_eagle3(ckpt / "eagle3-llama", target, TinyEagle3Spec(style="llama"))
    write_tiny_eagle3(ckpt / "eagle3-mla", target, TinyEagle3Spec(style="mla"))
    cases.append(ds.DraftCase("eagle3-llama", "eagle3", str(ckpt / "eagle3-llama")))
    cases.append(ds.DraftCase("eagle3-mla", "eagle3", str(ckpt / "eagle3-mla")))
    if hasattr(ds, "write_tiny_dflash"):
        ds.write_tiny_dflash(ckpt / "dflash", target)
        block = getattr(getattr(ds, "TinyDFlashSpec", None), "block_size", 4)
        cases.append(ds.DraftCase("dflash", "dflash", str(ckpt / "dflash"), rows=int(block)))
    if getattr(ds, "has_unsharded_draft_patch", lambda: False)():
        cases.append(ds.DraftCase("eagle3-llama-draft-tp1", "eagle3", str(ckpt / "eagle3-llama"),
                                  options=(("draft_tensor_parallel_size", 1),)))
        placements["eagle3-llama-draft-tp1"] = "unsharded"
    else:
        skipped.append(("draft at draft_tensor_parallel_size 1",
                        "the unsharded-draft vLLM patch is not in the applied series"))
    opt = getattr(ds, "REPLICATED_EMBEDDING_OPTION", None)
    if opt and getattr(ds, "has_replicated_embedding_patch", lambda: False)():
        cases.append(ds.DraftCase("eagle3-llama-replicated-embedding", "eagle3",
                                  str(ckpt / "eagle3-llama"), options=((opt, True),)))
        placements["eagle3-llama-replicated-embedding"] = "replicated_embedding"
    else:
        skipped.append(("draft with a replicated embedding",
                        "the replicated-embedding vLLM patch is not in the applied series"))
    return cases, placements, skipped


def run_collectives(ctx: Context) -> Outcome:
    from testkit.checkpoints import write_tiny_kimi_k25
    from testkit.distributed import RankFailed, run_tp

    ckpt = Path(tempfile.mkdtemp(prefix="bench-collectives-"))
    try:
        write_tiny_kimi_k25(ckpt / "target")
        cases, placements, skipped = _draft_cases(ckpt, ctx.quick)
        rows_per_pass = 4
        extra = f" + {len(cases)} draft case(s)" if cases else ""
        ctx.progress(f"    gloo TP=2: target pass{extra}")
        try:
            res = run_tp(bench_rank, 2, str(ckpt / "target"), rows_per_pass, cases, placements,
                         timeout=480, env={"VLLM_LOGGING_LEVEL": "ERROR"})
        except RankFailed as exc:
            return Outcome("failed", first_line(exc), data={"error": scrub(str(exc))[-3000:]})
    finally:
        import shutil

        shutil.rmtree(ckpt, ignore_errors=True)
    r0, r1 = res
    spmd = r0["target"]["summary"] == r1["target"]["summary"]
    t = r0["target"]
    exp = t["expected"]
    rows = [[f"target pass + logits, {rows_per_pass} rows", *(_cnt(t["summary"])),
             f"{exp['all_reduce']} / {exp['all_gather']}",
             "yes" if not t["discrepancies"] else "no: " + "; ".join(t["discrepancies"])]]
    drafts_out = {}
    for name, d in r0["drafts"].items():
        if "error" in d:
            skipped.append((f"draft pass {name} ({d['method']})",
                            f"could not run on this machine: {d['error']}"))
            continue
        e = d["expected"]
        rows.append([f"draft {name} ({d['placement']}), {d['rows']} row(s)", *_cnt(d["summary"]),
                     f"{e['all_reduce']} / {e['all_gather']}",
                     "yes" if d["matches"] else f"no: counted {d['counted']}"])
        drafts_out[name] = d
    proj = r0["kimi_projection"]
    md = _markdown(t, rows, spmd, proj)
    status = "ok" if not t["discrepancies"] and spmd else "failed"
    if status == "ok" and len(drafts_out) < len(r0["drafts"]):
        status = "partial"  # some draft case could not run here
    return Outcome(status, None if status != "failed" else "counts differ from the config",
                   data={"tp": 2, "rows": rows_per_pass, "target": t, "drafts": drafts_out,
                         "spmd": spmd, "kimi_projection": proj},
                   markdown="\n".join(md), skipped=skipped)


def _markdown(t: dict, rows: list[list], spmd: bool, proj: dict) -> list[str]:
    """The section's report: counted vs config-derived, and the projection at Kimi dims."""
    prow = []
    for label, e in proj.items():
        prow.append([label, e["all_reduce"], fmt_bytes(e["all_reduce_bytes"]), e["all_gather"],
                     fmt_bytes(e["all_gather_bytes"])])
    md = [
        ("Collectives counted by instrumenting vLLM's `GroupCoordinator` "
        "(`vllm_kimi_ext.comm.CollectiveCounter`) while the tiny Kimi-K2.5-shaped target "
        "(and tiny drafts) run one pass at TP=2 over gloo, against the counts derived from "
        "each config. Bytes are one rank's payload."),
        "",
        md_table(["pass", "all-reduce", "AR bytes", "all-gather", "AG bytes",
                  "expected AR / AG", "matches config"], rows),
        "",
        (f"- Both ranks made identical calls: {'yes' if spmd else '**no**'}. A planted extra "
        f"all-reduce is caught by the check: {'yes' if t['planted_caught'] else '**no**'}."),
    ]
    local = t.get("local_logits") or {}
    if local.get("available"):
        md.append(f"- `compute_logits_local` (patch 0002): {local['collectives']} collectives, "
                  f"returns this rank's shard {tuple(local['shape'])}: "
                  f"{'matches' if local['matches_slice'] else 'does NOT match'} the gathered "
                  "logits.")
    md += [
        "",
        (f"The same config-derived formulas at Kimi-K2.5 dimensions ({KIMI['num_hidden_layers']} "
        f"layers, hidden {KIMI['hidden_size']}, vocab {KIMI['vocab_size']}), TP={KIMI_TP} "
        "(derived, not run):"),
        "",
        md_table(["pass", "all-reduce", "AR bytes/rank", "all-gather", "AG bytes/rank"], prow),
    ]
    return md


def _cnt(summary_rows: list) -> list[str]:
    ar = [r for r in summary_rows if r[2] == "all_reduce"]
    ag = [r for r in summary_rows if r[2] == "all_gather"]
    return [str(sum(r[3] for r in ar)), fmt_bytes(sum(r[4] for r in ar)),
            str(sum(r[3] for r in ag)), fmt_bytes(sum(r[4] for r in ag))]

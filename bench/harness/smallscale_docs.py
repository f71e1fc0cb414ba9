"""The small-scale run's tables in ``docs/training-a-draft.md``, made from its JSON.

``python -m bench.train_smallscale --out DIR`` writes ``DIR/results.json``; the copy
committed as :data:`RESULTS` is the run the document reports. Generated blocks:
``smallscale-setup`` (the run's settings and date), ``smallscale-sets`` (prompts, tokens
and shard bytes per set), ``smallscale-heldout`` (acceptance per head and held-out
source), ``smallscale-train-set`` (the traffic heads on their own training prompts) and
``smallscale-training`` (steps, tokens, losses, rate per head). A hand-edited number in
those blocks, or a new results file, makes the document stale
(``tests/unit/test_generated_docs.py``). Doc-generator convention:
``python -m bench.harness.smallscale_docs --write-docs docs/`` rewrites the blocks in
place, ``--check-docs docs/`` exits 1 when one is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.harness.bill_example import replace_blocks
from bench.harness.generated_docs import in_place_main

DOC = "training-a-draft.md"
PROG = "python -m bench.harness.smallscale_docs"
RESULTS = Path(__file__).resolve().parents[1] / "reports" / "train-smallscale" / "results.json"

#: head name in results.json -> how the document names it
HEADS = {
    "untrained": "untrained",
    "generic": "generic (public-head stand-in)",
    "fine-tuned": "generic → fine-tuned on traffic",
    "traffic-only": "untrained → traffic only",
    "generic-control": "generic + the same steps on generic data (control)",
}
#: the head each trained head started from, and the set it trained on
TRAINED_ON = {"generic": "generic", "fine-tuned": "traffic", "traffic-only": "traffic",
              "generic-control": "generic"}
SETS = {"generic": "generic (MT-Bench)", "traffic": "traffic", "heldout": "held-out"}


def _acceptance(results: dict) -> str:
    lines = ["| head | prompts | chains | α1 | α2 | α3 | τ (k=3, T=1) | greedy-draft τ | "
             "greedy τ |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, rows in results.items():
        for source, r in rows.items():
            bold = "**" if source == "all" else ""
            alpha = " | ".join(f"{a:.3f}" for a in r["alpha"])
            lines.append(f"| {HEADS.get(name, name)} | {bold}{source}{bold} | {r['chains']} | "
                         f"{alpha} | {bold}{r['tau']:.3f}{bold} | "
                         f"{r['greedy_draft_tau']:.3f} | {r['greedy_tau']:.3f} |")
    return "\n".join(lines)


def _sets(data: dict) -> str:
    lines = ["| set | prompts | by source | prompt tokens | response tokens | "
             "hidden-state shards |", "|---|---:|---|---:|---:|---:|"]
    for split, d in data.items():
        sources = ", ".join(f"{k} {v}" for k, v in sorted(d["sources"].items()))
        lines.append(f"| {SETS.get(split, split)} | {d['samples']} | {sources} | "
                     f"{d['prompt_tokens']} | {d['response_tokens']} | "
                     f"{d['disk_bytes'] / 1e6:.1f} MB |")
    return "\n".join(lines)


def _training(training: dict) -> str:
    lines = ["| head | trained on | steps | tokens | first → last loss | tokens/s (CPU) |",
             "|---|---|---:|---:|---|---:|"]
    for name, t in training.items():
        lines.append(f"| {HEADS.get(name, name)} | {TRAINED_ON.get(name, '?')} | {t['steps']} | "
                     f"{t['tokens']} | {t['first_loss']:.1f} → {t['last_loss']:.1f} | "
                     f"{t['tokens_per_s']:.0f} |")
    return "\n".join(lines)


def _setup(summary: dict) -> str:
    z = summary["sizes"]
    return (
        f"Measured on {summary['created'][:10]} on a shared 2-core CPU (no GPU; `python -m "
        f"bench.train_smallscale --out DIR`, seed {summary['seed']}, prompts of at most "
        f"{z['max_prompt_chars']} characters, {z['max_tokens']} new tokens at temperature 0.7 / "
        f"top-p 0.95, draft vocabulary {z['draft_vocab']} chosen by `draft shrink-vocab` from "
        "the regenerated training responses, TTT depth 3, AdamW "
        f"{z['lr']:g}, ≤ {z['max_len']} tokens per step with the last {z['prompt_context']} "
        f"prompt tokens kept, generic head {z['generic_epochs']:g} epochs, traffic heads "
        f"{z['traffic_epochs']:g}; {summary['torch_threads']} torch threads; held-out "
        f"draft-vocabulary coverage {100 * summary['heldout_draft_vocab_coverage']:.1f} %; "
        f"`{RESULTS.relative_to(RESULTS.parents[3])}` holds every number):")


def blocks(results_file: Path = RESULTS) -> dict[str, str]:
    summary = json.loads(results_file.read_text())
    return {"smallscale-setup": _setup(summary),
            "smallscale-sets": _sets(summary["data"]),
            "smallscale-heldout": _acceptance(summary["results"]),
            "smallscale-train-set": _acceptance(summary["train_set_results"]),
            "smallscale-training": _training(summary["training"])}


def main(argv: list[str] | None = None) -> int:
    return in_place_main(PROG, __doc__.split("\n\n")[0], DOC,
                         lambda text, _where: replace_blocks(text, blocks(), PROG), argv)


if __name__ == "__main__":
    sys.exit(main())

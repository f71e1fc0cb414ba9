"""``vllm-kimi-ext draft regenerate | capture | train | eval | bill``.

:func:`register_draft_subcommands` adds them to the ``draft`` command group
(``vllm_kimi_ext.cli`` calls it). Their tunable flags are generated from
:mod:`vllm_kimi_ext.train.settings`, where each default is written once. Heavy
imports (torch, transformers, speculators, vLLM) happen inside the handlers. Exit
codes (:mod:`vllm_kimi_ext.user_input`'s contract, applied by
:func:`vllm_kimi_ext.cli.run_handler`): 0 done, 1 findings (``train``: the doctor reports
errors on the written draft), 2 refused input (a :class:`~vllm_kimi_ext.user_input.UserInputError`
such as :class:`~vllm_kimi_ext.train.layout.DataError`: one line on stderr, nothing
half-written).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm_kimi_ext import facts
from vllm_kimi_ext.train import settings
from vllm_kimi_ext.train.settings import add_flags, from_args
from vllm_kimi_ext.user_input import EXIT_FINDINGS, EXIT_OK, integer, number

from .validate import check_args, strict_json


def register_draft_subcommands(sub: argparse._SubParsersAction) -> None:
    _register_regenerate(sub)
    _register_capture(sub)
    _register_train(sub)
    _register_eval(sub)
    _register_bill(sub)


def _json_arg(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _add_hf_model(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--hf-model", required=required, default=None,
                   help="run the target in-process with transformers (small CPU runs): a "
                        "model directory")
    p.add_argument("--gguf-file", default=None, help="GGUF file name inside --hf-model")


def _add_rehash(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rehash-shards", action="store_true",
                   help="before any work, read every hidden-state shard again to compare "
                        "its sha256 and finiteness with what capture recorded (default: "
                        "header, shape, size and the recorded flags only)")


def _add_trust_remote_code(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the Python code a checkpoint ships (its config's auto_map), as "
                        "vLLM's flag of the same name; off: such a checkpoint is refused")


def load_hf(model_dir: str, gguf_file: str | None = None, *, trust_remote_code: bool = False):
    """``(model, tokenizer)`` from a local directory (offline), float32 on CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_kimi_ext.user_input import UserInputError, one_line

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code,
                                            **kw)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                     trust_remote_code=trust_remote_code, **kw)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # files missing or unusable
        detail = one_line(str(exc)) or type(exc).__name__
        raise UserInputError(
            f"--hf-model {model_dir}: transformers cannot load a tokenizer and causal LM "
            f"from it ({detail[:200]}{'...' if len(detail) > 200 else ''})",
            file=str(model_dir), field="--hf-model",
            expected="a transformers model folder (config, tokenizer, weights)") from None
    return model.eval(), tok


def holdout_hashes(samples, every: int) -> set[str]:
    """A stable held-out split by conversation: the prompt hashes of the samples whose
    conversation id (the prompt hash for a one-turn record) is 0 modulo ``every``."""
    if not every:
        return set()
    return {s.prompt_hash for s in samples
            if int(s.conversation or s.prompt_hash, 16) % every == 0}


# --------------------------------------------------------------------------- #


def _register_regenerate(sub) -> None:
    p = sub.add_parser(
        "regenerate", help="answer a prompt set with the served target (training data)",
        description="Send every prompt (every turn of multi-turn records) to the target and "
                    "store the served prompt and response token ids in DATA/samples.jsonl. "
                    "Resumes: prompts already answered are skipped.")
    p.add_argument("--prompts", action="append", required=True, metavar="FILE",
                   help="JSONL (fields prompt/text/question/turns/content) or text; repeatable")
    p.add_argument("--field", default=None, help="JSONL field holding the prompt")
    p.add_argument("--first-turn-only", action="store_true")
    p.add_argument("--limit", type=integer, default=None, help="records per prompt file")
    p.add_argument("--out", required=True, help="data directory")
    p.add_argument("--server", default=None,
                   help="OpenAI-compatible base URL of the served target, e.g. "
                        "http://localhost:8000/v1")
    p.add_argument("--model", default=None, help="served model name (default: the server's)")
    p.add_argument("--api-key", default="EMPTY")
    _add_hf_model(p)
    add_flags(p, settings.Sampling)
    p.add_argument("--chat-template-kwargs", type=_json_arg, default=None,
                   help='JSON passed to the chat template, e.g. \'{"thinking": true}\'')
    add_flags(p, settings.Regeneration)
    _add_trust_remote_code(p)
    p.set_defaults(func=run_regenerate)


def run_regenerate(args) -> int:
    from .regenerate import (
        ServerGenerator,
        TransformersGenerator,
        load_conversations,
        regenerate,
    )

    check_args("regenerate", args)
    sampling = from_args(settings.Sampling, args)
    convs = load_conversations(args.prompts, field=args.field,
                               first_turn_only=args.first_turn_only, limit=args.limit)
    if args.server:
        gen = ServerGenerator(args.server, sampling, model=args.model,
                              chat_template_kwargs=args.chat_template_kwargs,
                              api_key=args.api_key, concurrency=args.concurrency)
    else:
        model, tok = load_hf(args.hf_model, args.gguf_file,
                             trust_remote_code=args.trust_remote_code)
        gen = TransformersGenerator(model, tok, sampling, name=args.hf_model,
                                    chat_template_kwargs=args.chat_template_kwargs)
    section = regenerate(args.out, convs, gen, chat_template_kwargs=args.chat_template_kwargs,
                         batch_size=args.batch_size)
    print(strict_json(section["measured"]))
    return EXIT_OK


def _register_capture(sub) -> None:
    p = sub.add_parser(
        "capture", help="store the target's hidden states for every regenerated sample",
        description="Capture the aux-layer and last-layer hidden states of every sample in "
                    "DATA (vLLM's extract_hidden_states at the target's TP size, or "
                    "transformers on CPU). Prints the disk needed first; resumes.")
    p.add_argument("--data", required=True)
    p.add_argument("--vllm-target", default=None, help="target checkpoint served by vLLM")
    add_flags(p, settings.Capture, only=("tensor_parallel_size",))
    p.add_argument("--max-model-len", type=integer, default=None)
    p.add_argument("--staging", default=None,
                   help="where vLLM's connector writes first (default DATA/.staging; a "
                        "RAM disk such as /dev/shm/hs is faster)")
    _add_hf_model(p)
    p.add_argument("--layer-ids", type=integer, nargs="+", default=None,
                   help="ascending layer ids, the last = the target's layer count "
                        "(default: an earlier capture's on resume, else vLLM's taps 2, L//2, "
                        "L-3 clipped to the target's depth, then L)")
    add_flags(p, settings.Capture, only=("dtype", "batch_size"))
    p.add_argument("--no-space-check", action="store_true")
    p.add_argument("--speculators-dataset", action="store_true",
                   help="also write the Arrow dataset `speculators train --data-path DATA` "
                        "reads")
    p.add_argument("--shard", type=_shard_arg, default=(0, 1), metavar="I/N",
                   help="capture only the samples whose index is I mod N: run N of these "
                        "(one per engine, I = 0..N-1) on the same --data")
    _add_trust_remote_code(p)
    p.set_defaults(func=run_capture)


def _shard_arg(text: str) -> tuple[int, int]:
    i, sep, n = text.partition("/")
    try:
        i_, n_ = integer(i), integer(n)
    except ValueError:
        i_ = n_ = -1
    if not sep or n_ < 1 or not 0 <= i_ < n_:
        raise argparse.ArgumentTypeError(f"expected I/N with 0 <= I < N, got {text!r}")
    return i_, n_


def run_capture(args) -> int:
    from .capture import TransformersCapture, VllmCapture, capture, vllm_engine_kwargs

    check_args("capture", args)  # --data read and checked before any model or engine
    if args.hf_model:
        model, _ = load_hf(args.hf_model, args.gguf_file,
                           trust_remote_code=args.trust_remote_code)
        backend = TransformersCapture(model, name=args.hf_model)
    else:
        from vllm import LLM

        staging = Path(args.staging or Path(args.data) / ".staging")
        llm = LLM(**vllm_engine_kwargs(args.vllm_target, args.layer_ids, staging,
                                       tensor_parallel_size=args.tensor_parallel_size,
                                       max_model_len=args.max_model_len,
                                       trust_remote_code=args.trust_remote_code))
        backend = VllmCapture(llm, target=args.vllm_target, staging_dir=staging,
                              tensor_parallel_size=args.tensor_parallel_size)
    section = capture(args.data, backend, layer_ids=args.layer_ids, dtype=args.dtype,
                      batch_size=args.batch_size, check_free_space=not args.no_space_check,
                      shard=args.shard)
    if args.speculators_dataset:
        from .export import write_speculators_dataset

        write_speculators_dataset(args.data)
    print(strict_json({k: section[k] for k in ("layer_ids", "dtype", "disk_bytes",
                                               "measured")}))
    return EXIT_OK


def _register_train(sub) -> None:
    p = sub.add_parser(
        "train", help="train or fine-tune an EAGLE-3 draft on captured data (speculators)",
        description="Train a Llama-style EAGLE-3 head with speculators on DATA (fresh, or "
                    "fine-tuning --init), export it as a flat EAGLE-3 directory vLLM loads and "
                    "run the doctor on it. Exit code 1 if the doctor reports errors.")
    p.add_argument("--data", required=True)
    p.add_argument("--target", required=True,
                   help="target directory: config.json + safetensors with the embedding, "
                        "lm_head and final norm")
    p.add_argument("--out", required=True, help="draft directory to write (written beside it "
                   "and renamed into place: never half-written)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing non-empty --out (kept until the new one is whole)")
    p.add_argument("--init", default=None,
                   help="head to fine-tune: a flat EAGLE-3 directory or a speculators checkpoint")
    vocab = p.add_mutually_exclusive_group()
    vocab.add_argument("--draft-vocab-size", type=integer, default=None,
                       help="reduced draft vocabulary: the most frequent response tokens")
    vocab.add_argument("--draft-vocab-from", default=None,
                       help="take d2t/t2d from a `draft shrink-vocab` output directory")
    head = facts.draft_shape("lightseek-eagle3")  # the public Llama-style head, as an example
    example = {"head_dim": head.head_dim, "num_key_value_heads": head.num_key_value_heads,
               "intermediate_size": head.intermediate_size}
    p.add_argument("--draft-layer", type=_json_arg, default=None,
                   help=f"Llama layer fields of a fresh head, e.g. '{json.dumps(example)}'")
    add_flags(p, settings.TrainConfig)
    add_flags(p, settings.Holdout)
    _add_train_scale_flags(p)
    _add_rehash(p)
    _add_trust_remote_code(p)
    p.set_defaults(func=run_train)


def _add_train_scale_flags(p: argparse.ArgumentParser) -> None:
    """``--resume`` (the long-run settings themselves are generated from TrainConfig)."""
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --checkpoint-dir (same "
                        "settings; exact continuation); starts from the beginning if there is "
                        "none. Several GPUs: `torchrun --nproc-per-node N $(which "
                        "vllm-kimi-ext) draft train ...` (data parallel)")


def run_train(args) -> int:
    from . import layout
    from .bridge import DraftOptions
    from .trainer import train

    check_args("train", args)  # flags together, numbers, paths, --out apart from inputs, data
    cfg = from_args(settings.TrainConfig, args, resume=args.resume)
    held = holdout_hashes(layout.read_samples(args.data, tokens=False), args.holdout_every)
    result = train(args.data, args.target, args.out, init=args.init,
                   draft_vocab_size=args.draft_vocab_size,
                   draft_vocab_from=args.draft_vocab_from, holdout=held, config=cfg,
                   options=DraftOptions(layer_overrides=args.draft_layer,
                                        trust_remote_code=args.trust_remote_code),
                   force=args.force)
    if result.doctor.get("rank", 0):  # another rank of a torchrun job: rank 0 reports
        return EXIT_OK
    print(strict_json({"out": str(result.out_dir), "steps": result.steps,
                      "first_loss": result.losses[0] if result.losses else None,
                      "last_loss": result.losses[-1] if result.losses else None,
                      "tokens_per_s": round(result.tokens_per_s, 2)}))
    return EXIT_OK if result.doctor["ok"] else EXIT_FINDINGS


def _register_eval(sub) -> None:
    p = sub.add_parser(
        "eval", help="teacher-forced acceptance of drafts on captured data",
        description="Per draft depth, sum(min(p, q)) (acceptance at temperature 1) and "
                    "tau at k, greedy counterparts, per prompt source.")
    p.add_argument("--data", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", action="append", required=True, help="draft directory; repeatable")
    add_flags(p, settings.Evaluation)
    add_flags(p, settings.Holdout)
    p.add_argument("--split", choices=("heldout", "train", "all"), default="all")
    p.add_argument("--json", action="store_true")
    _add_rehash(p)
    _add_trust_remote_code(p)
    p.set_defaults(func=run_eval)


def _warn_eval_cut(results: dict, max_len: int) -> None:
    import sys

    for draft, rows in results.items():
        r = rows.get("all", {})
        if r.get("samples_cut"):
            print(f"warning: --max-len {max_len} cut {r['samples_cut']} samples for {draft}: "
                  f"{r['tokens_dropped']} tokens ({r['loss_tokens_dropped']} response tokens) "
                  "not evaluated", file=sys.stderr)


def _stderr(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr)


def run_eval(args) -> int:
    from . import layout, trainer
    from .evaluate import check_chains, evaluate, format_table

    check_args("eval", args)
    samples = layout.read_samples(args.data, tokens=False)
    held = holdout_hashes(samples, args.holdout_every)
    pick = {"all": lambda s: True, "heldout": lambda s: s.prompt_hash in held,
            "train": lambda s: s.prompt_hash not in held}[args.split]
    cap = trainer.capture_settings(args.data)
    chosen = trainer.captured_samples(args.data, [s for s in samples if pick(s)], cap,
                                      log=_stderr, what="eval")
    check_chains(chosen, args.k, args.max_len)  # before any model is built
    results = {d: evaluate(args.data, args.target, d, samples=chosen, k=args.k,
                           max_len=args.max_len, chunk=args.chunk, device=args.device,
                           trust_remote_code=args.trust_remote_code)
               for d in args.draft}
    _warn_eval_cut(results, args.max_len)
    print(strict_json(results, indent=1) if args.json else format_table(results, args.k))
    return EXIT_OK


def _register_bill(sub) -> None:
    p = sub.add_parser(
        "bill", help="what training a Kimi-K2.5 draft on your traffic costs",
        description="Disk, regeneration/capture hours on the box, training GPU-hours and "
                    "whether fine-tuning beats switching drafts; from a pilot's measured "
                    "figures, the cost model and documented constants.")
    p.add_argument("--prompts", type=integer, default=None, help="samples to train on")
    p.add_argument("--gain-fraction", type=number, default=None,
                   help="instead of --prompts: the share of the attainable gain to reach")
    p.add_argument("--n-half", type=number, default=None,
                   help="samples reaching half the gain (default: documented assumption)")
    p.add_argument("--prompt-tokens", type=number, default=None)
    p.add_argument("--response-tokens", type=number, default=None)
    p.add_argument("--measured", default=None, help="a pilot's data directory")
    p.add_argument("--measured-train", default=None, help="a pilot's training.json")
    add_flags(p, settings.Bill, only=("hardware", "decode_batch", "context"))
    p.add_argument("--decode-tok-s", type=number, default=None)
    p.add_argument("--prefill-tok-s", type=number, default=None)
    p.add_argument("--online", action="store_true",
                   help="hidden states streamed to the trainer (disk: a staging window only)")
    add_flags(p, settings.TrainConfig, only=("ttt_steps", "epochs"))
    p.add_argument("--tau-now", type=number, default=None,
                   help="tau of today's draft on your traffic (draft eval / serving logs)")
    p.add_argument("--tau-after", type=number, default=None, help="expected tau after fine-tuning")
    p.add_argument("--tau-alt", type=number, default=None, help="tau of the other public draft")
    add_flags(p, settings.Bill, only=("alt_step_cost", "disk_read_gb_s"))
    add_flags(p, settings.TrainConfig, only=("max_len",))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_bill)


def run_bill(args) -> int:
    from . import bill as b

    check_args("bill", args)  # every number in range: a zero is refused, never a default
    measured = b.load_measured(args.measured, args.measured_train)
    prompts = args.prompts if args.prompts is not None else math_ceil(
        b.samples_for_gain(args.gain_fraction,
                           args.n_half if args.n_half is not None else b.N_HALF_SAMPLES))
    traffic = b.Traffic(
        prompts,
        _first_set(args.prompt_tokens, measured.get("prompt_tokens"), b.Traffic.prompt_tokens),
        _first_set(args.response_tokens, measured.get("response_tokens"),
                   b.Traffic.response_tokens))
    sources = {"lengths": "measured (pilot)" if "prompt_tokens" in measured and
               args.prompt_tokens is None else "given / assumed"}
    decode = _first_set(args.decode_tok_s, measured.get("decode_tokens_per_s"))
    prefill = _first_set(args.prefill_tok_s, measured.get("prefill_tokens_per_s"))
    box_kw = {}  # compute_bill's own box unless the hardware profile is read
    if decode is None or prefill is None:
        box = b.box_rates(args.hardware, args.decode_batch, args.context)
        box_kw = {"box_gpu_tflops": box["gpu_tflops"], "box_gpus": box["gpus"]}
        if decode is None:
            decode = box["decode_tokens_per_s"]
            sources["decode"] = f"{box['source']}, batch {args.decode_batch}, no speculation"
        if prefill is None:
            prefill = b.prefill_tokens_per_s(box["gpu_tflops"], box["compute_efficiency"],
                                             box["gpus"])
            sources["prefill"] = (f"{box['source']}: {box['gpus']} x {box['gpu_tflops']:.0f} "
                                  f"TFLOPS x {box['compute_efficiency']} / (2 x "
                                  f"{b.KIMI_ACTIVE_PARAMS:.0e} active params)")
    result = b.compute_bill(traffic, decode_tokens_per_s=decode, prefill_tokens_per_s=prefill,
                            online=args.online, ttt_steps=args.ttt_steps, epochs=args.epochs,
                            **box_kw,
                            measured_train_tokens_per_s=measured.get("train_tokens_per_s"),
                            sources=sources, disk_read_bytes_per_s=args.disk_read_gb_s * 1e9,
                            tokens_per_step=args.max_len)
    cmp = None
    if args.tau_now is not None and args.tau_after is not None:
        cmp = b.fine_tune_vs_switch(args.tau_now, args.tau_after,
                                    args.tau_alt if args.tau_alt is not None else args.tau_now,
                                    result.box_hours, args.alt_step_cost)
    if args.json:  # strict JSON: a payback that never comes is null, not Infinity
        print(strict_json({"bill": result.to_dict(), "compare": cmp}, indent=1))
    else:
        print(b.format_bill(result, cmp))
    return EXIT_OK


def _first_set(*values):
    """The first value that is not None (a given 0 is kept, and refused by the checks)."""
    return next((v for v in values if v is not None), None)


def math_ceil(x: float) -> int:
    import math

    return int(math.ceil(x))

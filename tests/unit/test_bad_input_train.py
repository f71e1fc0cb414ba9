"""Every bad input to ``draft regenerate | capture | train | eval | bill`` and to the
``VLLM_KIMI_EXT*`` environment variables is refused before any work: exit 2, one line
naming the flag or file, no traceback, and every input file byte for byte as it was
(nothing written either).

The cases are a table, one list per command, built on a few small inputs written once
per session (a target folder, a captured data directory, an EAGLE-3 head, a prompt
file, a checkpoint whose custom code would write a marker file) and copied per case.
Validation happens before any model is loaded, which is what keeps the whole table
to seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from testkit.bad_input import Case, Result, Workspace
from vllm_kimi_ext import envs

HIDDEN, LAYERS, VOCAB, HEADS = 64, 6, 768, 4
LAYER_IDS = [2, 3, 4, 6]  # a valid explicit choice for the 6-layer target
MARKER = "REMOTE_CODE_RAN"

# --------------------------------------------------------------------------- #
# Inputs (written once per session)                                            #
# --------------------------------------------------------------------------- #


def _target_config(**changes) -> dict:
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
           "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
           "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
           "intermediate_size": 96, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
           "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False}
    cfg.update(changes)
    return cfg


def _write_target(path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(_target_config()))
    g = torch.Generator().manual_seed(0)
    save_file({"model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=g),
               "lm_head.weight": torch.randn(VOCAB, HIDDEN, generator=g),
               "model.norm.weight": torch.ones(HIDDEN)}, str(path / "model.safetensors"))


class _ShardWriter:
    """A capture backend writing seeded states (what `draft capture` would store)."""

    hidden_size, num_hidden_layers = HIDDEN, LAYERS
    description = {"backend": "transformers", "target": "target", "tensor_parallel_size": 1}

    def capture(self, samples, layer_ids, paths, dtype):
        import torch

        from vllm_kimi_ext.train import capture

        for s, p in zip(samples, paths):
            g = torch.Generator().manual_seed(s.index)
            hs = torch.randn(s.num_tokens, len(layer_ids), HIDDEN, generator=g)
            capture._save_shard(p, hs.to(torch.bfloat16), torch.tensor(s.input_ids))


def _write_data(path: Path) -> None:
    from vllm_kimi_ext.train import capture, layout

    samples = [layout.Sample(i, f"{i:024x}", "chat", [{"role": "user", "content": f"q{i}"}],
                             [5 + i, 6, 7, 8], [9, 10 + i, 11, 12, 13, 1]) for i in range(4)]
    layout.append_samples(path, samples)
    layout.update_manifest(path, generation={"backend": "transformers", "model": "tiny"})
    capture.capture(path, _ShardWriter(), layer_ids=LAYER_IDS, progress=False,
                    log=lambda _m: None)


def _write_remote(path: Path) -> None:
    """A checkpoint with custom code (``auto_map``); :func:`_remote_code` writes the code."""
    path.mkdir(parents=True)
    cfg = _target_config(model_type="tiny_remote", auto_map={
        "AutoConfig": "configuration_tiny.TinyConfig",
        "AutoModelForCausalLM": "modeling_tiny.TinyModel"})
    (path / "config.json").write_text(json.dumps(cfg))


def _write_head(path: Path) -> None:
    from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3

    write_tiny_eagle3(path, TinyKimiSpec(num_hidden_layers=LAYERS, num_ranks=VOCAB - 256),
                      TinyEagle3Spec(aux_layer_ids=tuple(LAYER_IDS[:-1])))


class TrainBases:
    """The inputs, written lazily once; ``copy_all`` gives a case its own copies."""

    NAMES = ("target", "data", "head", "hf", "remote", "prompts.jsonl")

    def __init__(self, root: Path):
        self.root = root
        self.made = False

    def get(self, name: str) -> Path:  # Workspace's interface
        self._make()
        return self.root / name

    def _make(self) -> None:
        if self.made:
            return
        r = self.root
        _write_target(r / "target")
        _write_data(r / "data")
        _write_head(r / "head")
        (r / "hf").mkdir()
        (r / "hf" / "config.json").write_text(json.dumps(_target_config()))
        _write_remote(r / "remote")
        (r / "prompts.jsonl").write_text(
            "".join(json.dumps({"prompt": f"question {i}?"}) + "\n" for i in range(3)))
        self.made = True


def _inputs(ws: Workspace) -> dict[str, Path]:
    """Copies of every base in the case's folder, and the paths of things to name."""
    base = ws.bases.get("target").parent
    paths: dict[str, Path] = {}
    for name in TrainBases.NAMES:
        src, dst = base / name, ws.tmp / name
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
        paths[name.split(".")[0]] = dst
    marker = ws.tmp / MARKER
    _remote_code(paths["remote"], marker)
    paths.update(marker=marker, new=ws.tmp / "new-out", missing=ws.tmp / "missing",
                 file=paths["prompts"], tmp=ws.tmp)
    return paths


def _remote_code(folder: Path, marker: Path) -> None:
    """The checkpoint's code: importing it (what trust_remote_code does) writes ``marker``."""
    code = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
    for name in ("configuration_tiny.py", "modeling_tiny.py"):
        (folder / name).write_text(code)


def _build(*edits):
    """A case's ``build``: the inputs, then ``edits`` (functions of the paths dict)."""

    def build(ws: Workspace) -> dict[str, Path]:
        paths = _inputs(ws)
        for edit in edits:
            edit(paths)
        return paths

    return build


def _no_gpus() -> None:
    if __import__("torch").cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the no-GPU refusal cannot show")


def _json_edit(key: str, file: str = "config.json", **changes):
    def edit(paths):
        path = paths[key] / file
        cfg = json.loads(path.read_text())
        cfg.update(changes)
        path.write_text(json.dumps(cfg))
    return edit


def _drop(key: str, *rel: str):
    def edit(paths):
        for r in rel:
            target = paths[key] / r
            shutil.rmtree(target) if target.is_dir() else target.unlink()
    return edit


def _put(rel: str, content: str | bytes):
    def edit(paths):
        path = paths["tmp"] / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return edit


def _no_training(*edits):
    """A ``build`` whose case must be refused before the ranks are set up: reaching them
    is an internal error (so a refusal that went missing fails in seconds, not after a
    training run)."""

    def build(ws: Workspace) -> dict[str, Path]:
        from vllm_kimi_ext.train import runstate

        def reached(*_a, **_kw):
            raise RuntimeError("training started: the case was not refused")

        ws.monkeypatch.setattr(runstate, "setup_ranks", reached)
        return _build(*edits)(ws)

    return build


# --------------------------------------------------------------------------- #
# The table                                                                    #
# --------------------------------------------------------------------------- #

REGEN = ("draft", "regenerate", "--prompts", "{prompts}", "--out", "{new}", "--server",
         "http://127.0.0.1:9/v1")
REGEN_HF = ("draft", "regenerate", "--prompts", "{prompts}", "--out", "{new}", "--hf-model",
            "{hf}")
CAPTURE = ("draft", "capture", "--data", "{data}", "--hf-model", "{hf}")
CAPTURE_VLLM = ("draft", "capture", "--data", "{data}", "--vllm-target", "{target}",
                "--tensor-parallel-size", "1")  # --layer-ids: the data's (the default on resume)
TRAIN = ("draft", "train", "--data", "{data}", "--target", "{target}", "--out", "{new}")
EVAL = ("draft", "eval", "--data", "{data}", "--target", "{target}", "--draft", "{head}")
BILL = ("draft", "bill", "--prompts", "1000", "--decode-tok-s", "100", "--prefill-tok-s", "1000")


def _case(id_: str, argv, words, *edits, code: int = 2, absent=()) -> Case:
    return Case(id_, tuple(argv), code, tuple(words), _build(*edits), absent=tuple(absent))


def _with(base: tuple, *extra: str, drop: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``base`` without the options in ``drop`` (and their value), plus ``extra``."""
    out, skip = [], False
    for i, a in enumerate(base):
        if skip:
            skip = False
            continue
        if a in drop:
            skip = i + 1 < len(base) and not base[i + 1].startswith("--")
            continue
        out.append(a)
    return tuple(out) + extra


def _numbers(tool: str, base: tuple, table: list[tuple[str, str, str]]) -> list[Case]:
    """One case per ``(flag, value, expected words)``."""
    return [_case(f"{tool}/{flag.lstrip('-')}-{value}", _with(base, flag, value, drop=(flag,)),
                  [flag, words]) for flag, value, words in table]


REGENERATE_CASES: list[Case] = [
    *_numbers("regenerate", REGEN, [
        ("--limit", "0", "expected an integer >= 1"),
        ("--limit", "-1", "expected an integer >= 1"),
        ("--concurrency", "0", ">= 1"), ("--concurrency", "-4", ">= 1"),
        ("--max-tokens", "0", ">= 1"), ("--max-tokens", "-1", ">= 1"),
        ("--temperature", "-0.5", "expected a finite number >= 0"),
        ("--temperature", "nan", "finite"), ("--temperature", "inf", "finite"),
        ("--top-p", "0", "in (0, 1]"), ("--top-p", "2", "in (0, 1]"),
        ("--top-p", "-0.1", "in (0, 1]"), ("--top-p", "nan", "in (0, 1]"),
        ("--seed", "-1", "in [0, 4294967295]"), ("--batch-size", "0", ">= 1"),
        ("--batch-size", "-1", ">= 1"),
    ]),
    _case("regenerate/limit-not-a-number", _with(REGEN, "--limit", "ten"), ["--limit", "ten"]),
    _case("regenerate/max-tokens-fraction", _with(REGEN, "--max-tokens", "1.5"),
          ["--max-tokens", "1.5"]),
    _case("regenerate/no-backend", _with(REGEN, drop=("--server",)),
          ["exactly one of --server, --hf-model"]),
    _case("regenerate/both-backends", _with(REGEN, "--hf-model", "{hf}"),
          ["exactly one of --server, --hf-model"]),
    _case("regenerate/server-without-scheme", _with(REGEN, "--server", "localhost:8000",
                                                    drop=("--server",)),
          ["--server 'localhost:8000'", "http://"]),
    _case("regenerate/server-ftp", _with(REGEN, "--server", "ftp://x/v1", drop=("--server",)),
          ["--server", "http://"]),
    _case("regenerate/server-unreachable", REGEN, ["server http://127.0.0.1:9/v1"]),
    _case("regenerate/prompts-missing", _with(REGEN, "--prompts", "{missing}",
                                              drop=("--prompts",)),
          ["--prompts {missing}: no such file"]),
    _case("regenerate/second-prompts-missing", _with(REGEN, "--prompts", "{missing}"),
          ["--prompts {missing}: no such file"]),
    _case("regenerate/prompts-is-folder", _with(REGEN, "--prompts", "{data}",
                                                drop=("--prompts",)),
          ["--prompts {data}: is a folder, expected a file"]),
    _case("regenerate/prompts-empty-path", _with(REGEN, "--prompts", "", drop=("--prompts",)),
          ["--prompts: empty path"]),
    _case("regenerate/prompts-empty-file", REGEN, ["{prompts}", "no usable records"],
          _put("prompts.jsonl", "")),
    _case("regenerate/prompts-bad-json", REGEN, ["prompts.jsonl"],
          _put("prompts.jsonl", '{"prompt": "a"}\n{"prompt": \n')),
    _case("regenerate/hf-model-missing", _with(REGEN_HF, "--hf-model", "{missing}",
                                               drop=("--hf-model",)),
          ["--hf-model {missing}: no such folder"]),
    _case("regenerate/hf-model-is-file", _with(REGEN_HF, "--hf-model", "{file}",
                                               drop=("--hf-model",)),
          ["--hf-model {file}: is a file, expected a folder"]),
    _case("regenerate/hf-model-without-config", REGEN_HF, ["--hf-model", "no config.json"],
          _drop("hf", "config.json")),
    _case("regenerate/gguf-file-missing", _with(REGEN_HF, "--gguf-file", "m.gguf"),
          ["--gguf-file", "m.gguf: no such file"]),
    _case("regenerate/gguf-without-hf-model", _with(REGEN, "--gguf-file", "m.gguf"),
          ["--gguf-file needs --hf-model"]),
    _case("regenerate/hf-model-remote-code", _with(REGEN_HF, "--hf-model", "{remote}",
                                                   drop=("--hf-model",)),
          ["--hf-model {remote}", "auto_map", "--trust-remote-code"], absent=("marker",)),
    _case("regenerate/out-is-file", _with(REGEN, "--out", "{file}", drop=("--out",)),
          ["--out {file}: is a file, expected a folder"]),
    _case("regenerate/out-under-a-file", _with(REGEN, "--out", "{file}/sub", drop=("--out",)),
          ["--out", "is a file, so this folder cannot be created"]),
    _case("regenerate/out-not-a-data-dir", _with(REGEN, "--out", "{head}", drop=("--out",)),
          ["--out {head}: not empty and not a data directory"]),
    _case("regenerate/out-is-hf-model", _with(REGEN_HF, "--out", "{hf}", drop=("--out",)),
          ["--out {hf} is the same path as --hf-model {hf}"]),
    _case("regenerate/out-inside-hf-model", _with(REGEN_HF, "--out", "{hf}/data",
                                                  drop=("--out",)),
          ["lies inside --hf-model"]),
    _case("regenerate/out-contains-prompts", _with(REGEN, "--out", "{tmp}", drop=("--out",)),
          ["--out {tmp} contains --prompts"]),
    _case("regenerate/resume-other-model", _with(REGEN_HF, "--out", "{data}", drop=("--out",)),
          ["generated with model 'tiny'", "--hf-model", "new --out"]),
    _case("regenerate/resume-other-served-model",
          _with(REGEN, "--out", "{data}", "--model", "other", drop=("--out",)),
          ["generated with model 'other-served'", "this run uses 'other' (--model)"],
          _json_edit("data", "manifest.json", generation={"backend": "openai-server",
                                                          "model": "other-served"})),
    _case("regenerate/resume-other-backend", _with(REGEN, "--out", "{data}", drop=("--out",)),
          ["generated with backend 'transformers'", "'openai-server'"]),
    _case("regenerate/template-kwargs-not-json",
          _with(REGEN, "--chat-template-kwargs", "{thinking: true}"),
          ["--chat-template-kwargs", "not valid JSON"]),
    _case("regenerate/template-kwargs-list", _with(REGEN, "--chat-template-kwargs", "[1]"),
          ["--chat-template-kwargs", "expected a JSON object"]),
]

CAPTURE_CASES: list[Case] = [
    *_numbers("capture", CAPTURE_VLLM, [
        ("--tensor-parallel-size", "0", ">= 1"), ("--tensor-parallel-size", "-8", ">= 1"),
        ("--max-model-len", "0", ">= 1"), ("--max-model-len", "-1", ">= 1"),
        ("--batch-size", "0", ">= 1"), ("--batch-size", "-64", ">= 1"),
        # ASCII digits only (Python's int() reads these)
        ("--batch-size", "1_000", "invalid integer value: '1_000'"),
        ("--max-model-len", "\u0663", "invalid integer value: '\u0663'"),
        ("--shard", "\uff10/2", "expected I/N with 0 <= I < N, got '\uff10/2'"),
    ]),
    _case("capture/no-backend", ("draft", "capture", "--data", "{data}"),
          ["exactly one of --vllm-target, --hf-model"]),
    _case("capture/both-backends", _with(CAPTURE, "--vllm-target", "{target}"),
          ["exactly one of --vllm-target, --hf-model"]),
    _case("capture/data-missing", _with(CAPTURE, "--data", "{missing}", drop=("--data",)),
          ["--data {missing}: no such folder"]),
    _case("capture/data-is-file", _with(CAPTURE, "--data", "{file}", drop=("--data",)),
          ["--data {file}: is a file"]),
    _case("capture/data-without-samples", _with(CAPTURE, "--data", "{head}", drop=("--data",)),
          ["--data {head}: no samples.jsonl"]),
    _case("capture/data-samples-empty", CAPTURE, ["samples.jsonl: no samples"],
          _put("data/samples.jsonl", "")),
    _case("capture/data-samples-bad-line", CAPTURE, ["samples.jsonl:1: not valid JSON"],
          _put("data/samples.jsonl", "{oops\n{}\n")),
    _case("capture/data-samples-string-ids", CAPTURE,
          ["samples.jsonl:1", "prompt_token_ids", "expected an integer token id"],
          _put("data/samples.jsonl", json.dumps({"index": 0, "prompt_hash": "x",
                                                 "prompt_token_ids": ["1"],
                                                 "output_token_ids": [2]}) + "\n")),
    _case("capture/id-outside-vocab-before-engine", CAPTURE_VLLM,
          ["samples.jsonl", "token id 9999", f"[0, {VOCAB})"],
          _put("data/samples.jsonl", json.dumps({"index": 0, "prompt_hash": "x",
                                                 "prompt_token_ids": [1, 9999],
                                                 "output_token_ids": [2]}) + "\n")),
    _case("capture/manifest-not-json", CAPTURE, ["manifest.json: not valid JSON"],
          _put("data/manifest.json", "{")),
    _case("capture/manifest-other-format", CAPTURE, ["manifest.json", "'format'"],
          _put("data/manifest.json", '{"format": "other/9"}')),
    _case("capture/earlier-capture-of-a-deeper-target", CAPTURE,
          ["manifest.json: captured with layer_ids [2, 3, 4, 8]", "asks [2, 3, 6]"],
          _json_edit("data", "manifest.json", capture={"layer_ids": [2, 3, 4, 8],
                                                       "dtype": "bfloat16", "hidden_size": 64})),
    _case("capture/other-layer-ids-than-before", _with(CAPTURE, "--layer-ids", "1", "3", "6"),
          ["captured with layer_ids [2, 3, 4, 6]", "new --data"]),
    _case("capture/vllm-target-missing", _with(CAPTURE_VLLM, "--vllm-target", "{missing}",
                                               drop=("--vllm-target",)),
          ["--vllm-target {missing}: no such folder"]),
    _case("capture/vllm-target-without-config", CAPTURE_VLLM,
          ["--vllm-target", "no config.json"], _drop("target", "config.json")),
    _case("capture/vllm-target-config-not-json", CAPTURE_VLLM,
          ["--vllm-target", "config.json: not valid JSON"], _put("target/config.json", "{x")),
    _case("capture/vllm-target-without-layers", CAPTURE_VLLM,
          ["config.json field 'num_hidden_layers' is None"],
          _json_edit("target", num_hidden_layers=None)),
    _case("capture/vllm-target-vocab-text", CAPTURE_VLLM,
          ["config.json field 'vocab_size' is 'big'"], _json_edit("target", vocab_size="big")),
    _case("capture/hf-model-is-file", _with(CAPTURE, "--hf-model", "{file}",
                                            drop=("--hf-model",)),
          ["--hf-model {file}: is a file"]),
    _case("capture/layer-ids-last-not-depth", _with(CAPTURE, "--layer-ids", "1", "2"),
          ["--layer-ids 1 2", f"end with {LAYERS}"]),
    _case("capture/layer-ids-descending", _with(CAPTURE, "--layer-ids", "3", "2", "6"),
          ["--layer-ids 3 2 6", "ascending"]),
    _case("capture/layer-ids-negative", _with(CAPTURE, "--layer-ids", "-1", "6"),
          ["--layer-ids -1 6", "[0, 6]"]),
    _case("capture/layer-ids-one", _with(CAPTURE, "--layer-ids", "6"), ["--layer-ids 6"]),
    _case("capture/layer-ids-beyond", _with(CAPTURE, "--layer-ids", "2", "9"),
          ["--layer-ids 2 9", "the target has 6 layers"]),
    _case("capture/layer-ids-duplicate", _with(CAPTURE, "--layer-ids", "2", "2", "6"),
          ["--layer-ids 2 2 6", "distinct"]),
    _case("capture/dtype-int8", _with(CAPTURE, "--dtype", "int8"), ["--dtype", "int8"]),
    _case("capture/tp-not-dividing-heads", _with(CAPTURE_VLLM, "--tensor-parallel-size", "3",
                                                 drop=("--tensor-parallel-size",)),
          ["--tensor-parallel-size 3", f"num_attention_heads ({HEADS})"]),
    _case("capture/tp-more-than-gpus", _with(CAPTURE_VLLM, "--tensor-parallel-size", "4",
                                             drop=("--tensor-parallel-size",)),
          ["--tensor-parallel-size 4", "GPU(s) visible"]),
    _case("capture/vllm-target-without-gpus", _with(CAPTURE_VLLM,
                                                    drop=("--tensor-parallel-size",)),
          ["--vllm-target runs vLLM on CUDA GPUs and none is visible"],
          lambda p: _no_gpus()),
    _case("capture/hf-model-unloadable", CAPTURE,
          ["--hf-model {hf}: transformers cannot load a tokenizer and causal LM from it"]),
    _case("capture/staging-is-file", _with(CAPTURE_VLLM, "--staging", "{file}"),
          ["--staging {file}: is a file"]),
    _case("capture/staging-inside-target", _with(CAPTURE_VLLM, "--staging", "{target}/stage"),
          ["--staging", "lies inside --vllm-target"]),
    _case("capture/data-is-target", _with(CAPTURE_VLLM, "--data", "{target}", drop=("--data",)),
          ["--data {target}", "no samples.jsonl"]),
    _case("capture/data-inside-hf-model", _with(CAPTURE, "--data", "{hf}", drop=("--data",)),
          ["--data {hf}"], _put("hf/samples.jsonl", "")),
    _case("capture/vllm-target-remote-code", _with(CAPTURE_VLLM, "--vllm-target", "{remote}",
                                                   drop=("--vllm-target",)),
          ["--vllm-target {remote}", "--trust-remote-code"], absent=("marker",)),
    _case("capture/hf-model-remote-code", _with(CAPTURE, "--hf-model", "{remote}",
                                                drop=("--hf-model",)),
          ["--hf-model {remote}", "--trust-remote-code"], absent=("marker",)),
]

TRAIN_CASES: list[Case] = [
    *_numbers("train", TRAIN, [
        ("--epochs", "0", "expected a finite number > 0"), ("--epochs", "-1", "> 0"),
        ("--epochs", "nan", "finite"), ("--epochs", "inf", "finite"),
        ("--max-steps", "-1", "expected an integer in [0, 1000000000]"),
        ("--max-steps", "0", "no --init is given"),
        ("--lr", "0", "in (0, 1]"), ("--lr", "-0.001", "in (0, 1]"), ("--lr", "nan", "finite"),
        ("--lr", "5", "in (0, 1]"), ("--max-len", "0", ">= 2"), ("--max-len", "4", "+ 2 = 5"),
        ("--prompt-context", "-1", ">= 0"), ("--ttt-steps", "0", "in [1, 64]"),
        ("--ttt-steps", "65", "in [1, 64]"), ("--seed", "-3", "in [0, 4294967295]"),
        ("--holdout-every", "-1", ">= 0"), ("--holdout-every", "1", "every sample"),
        ("--draft-vocab-size", "0", ">= 1"),
        ("--draft-vocab-size", "100000", f"vocab_size {VOCAB}"),
        ("--checkpoint-every", "0", ">= 1"), ("--val-fraction", "0.6", "in [0.0, 0.5]"),
        # ASCII digits only, and a step count below a billion
        ("--max-steps", "1_000", "invalid integer value: '1_000'"),
        ("--epochs", "1_0", "invalid number value: '1_0'"),
        ("--checkpoint-every", "\uff15", "got '\uff15'"),
        ("--max-steps", "9" * 26, "in [0, 1000000000]"),
        ("--checkpoint-every", "9" * 26, "in [1, 1000000000]"),
        ("--val-every", "0", ">= 1"), ("--patience", "0", ">= 1"),
        ("--loader-workers", "65", "in [0, 64]"),
    ]),
    _case("train/data-missing", _with(TRAIN, "--data", "{missing}", drop=("--data",)),
          ["--data {missing}: no such folder"], absent=("new",)),
    _case("train/data-is-file", _with(TRAIN, "--data", "{file}", drop=("--data",)),
          ["--data {file}: is a file"]),
    _case("train/data-without-samples", _with(TRAIN, "--data", "{hf}", drop=("--data",)),
          ["--data {hf}: no samples.jsonl"]),
    _case("train/data-not-captured", TRAIN, ["no capture section", "draft capture"],
          _drop("data", "manifest.json")),
    _case("train/data-no-complete-shard", TRAIN,
          ["--data", "hs_0.safetensors: recorded by capture but missing"],
          _drop("data", "hidden_states")),
    _case("train/data-other-target", TRAIN, ["captured with hidden_size 64", "has 128"],
          _json_edit("target", hidden_size=128)),
    _case("train/data-other-depth", TRAIN, ["captured with num_hidden_layers 6", "has 8"],
          _json_edit("target", num_hidden_layers=8)),
    _case("train/target-missing", _with(TRAIN, "--target", "{missing}", drop=("--target",)),
          ["--target {missing}: no such folder"]),
    _case("train/target-is-file", _with(TRAIN, "--target", "{file}", drop=("--target",)),
          ["--target {file}: is a file"]),
    _case("train/target-without-config", TRAIN, ["--target", "no config.json"],
          _drop("target", "config.json")),
    _case("train/target-vocab-negative", TRAIN, ["'vocab_size' is -5"],
          _json_edit("target", vocab_size=-5)),
    _case("train/target-remote-code", _with(TRAIN, "--target", "{remote}", drop=("--target",)),
          ["--target {remote}", "auto_map", "--trust-remote-code"], absent=("marker", "new")),
    _case("train/init-remote-code", _with(TRAIN, "--init", "{remote}"),
          ["--init {remote}", "--trust-remote-code"], absent=("marker", "new")),
    _case("train/init-missing", _with(TRAIN, "--init", "{missing}"),
          ["--init {missing}: no such folder"]),
    _case("train/init-without-config", _with(TRAIN, "--init", "{head}"),
          ["--init {head}: no config.json"], _drop("head", "config.json")),
    _case("train/vocab-from-missing", _with(TRAIN, "--draft-vocab-from", "{missing}"),
          ["--draft-vocab-from {missing}: no such folder"]),
    _case("train/vocab-from-file", _with(TRAIN, "--draft-vocab-from", "{file}"),
          ["--draft-vocab-from {file}: is a file"]),
    _case("train/vocab-size-and-from", _with(TRAIN, "--draft-vocab-size", "100",
                                             "--draft-vocab-from", "{head}"),
          ["--draft-vocab-from", "not allowed with argument --draft-vocab-size"]),
    _case("train/out-is-file", _with(TRAIN, "--out", "{file}", drop=("--out",)),
          ["--out {file}: is a file"]),
    _case("train/out-is-target", _with(TRAIN, "--out", "{target}", drop=("--out",)),
          ["--out {target} is the same path as --target {target}"]),
    _case("train/out-is-target-with-force", _with(TRAIN, "--out", "{target}", "--force",
                                                  drop=("--out",)),
          ["--out {target} is the same path as --target"]),
    _case("train/out-inside-target", _with(TRAIN, "--out", "{target}/draft", drop=("--out",)),
          ["--out {target}/draft lies inside --target {target}"]),
    _case("train/out-contains-target", _with(TRAIN, "--out", "{tmp}", drop=("--out",)),
          ["--out {tmp} contains --target"]),
    _case("train/out-is-init", _with(TRAIN, "--out", "{head}", "--init", "{head}",
                                     drop=("--out",)),
          ["--out {head} is the same path as --init {head}"]),
    _case("train/out-is-data", _with(TRAIN, "--out", "{data}", drop=("--out",)),
          ["--out {data} is the same path as --data {data}"]),
    _case("train/out-inside-data", _with(TRAIN, "--out", "{data}/draft", drop=("--out",)),
          ["lies inside --data {data}"]),
    _case("train/out-is-vocab-from", _with(TRAIN, "--out", "{head}", "--draft-vocab-from",
                                           "{head}", drop=("--out",)),
          ["is the same path as --draft-vocab-from"]),
    _case("train/out-via-symlink-is-target", _with(TRAIN, "--out", "{tmp}/link",
                                                   drop=("--out",)),
          ["is the same path as --target"], lambda p: os.symlink(p["target"], p["tmp"] / "link")),
    _case("train/out-exists-without-force", _with(TRAIN, "--out", "{hf}", drop=("--out",)),
          ["--out {hf}: exists and is not empty", "--force"]),
    _case("train/draft-layer-not-json", _with(TRAIN, "--draft-layer", "{head_dim: 8}"),
          ["--draft-layer", "not valid JSON"]),
    _case("train/draft-layer-list", _with(TRAIN, "--draft-layer", "[8]"),
          ["--draft-layer", "expected a JSON object"]),
    _case("train/draft-layer-hidden-size", _with(TRAIN, "--draft-layer", '{"hidden_size": 8}'),
          ["--draft-layer: hidden_size is fixed"]),
    _case("train/draft-layer-unknown-key", _with(TRAIN, "--draft-layer", '{"head_dimm": 8}'),
          ["--draft-layer: unknown field 'head_dimm'"]),
    _case("train/draft-layer-negative", _with(TRAIN, "--draft-layer", '{"head_dim": -1}'),
          ["--draft-layer: head_dim is -1, expected an integer >= 1"]),
    _case("train/draft-layer-text", _with(TRAIN, "--draft-layer", '{"intermediate_size": "x"}'),
          ["--draft-layer: intermediate_size is 'x'"]),
    _case("train/draft-layer-kv-heads", _with(
        TRAIN, "--draft-layer", '{"num_attention_heads": 4, "num_key_value_heads": 3}'),
        ["num_key_value_heads 3 must divide num_attention_heads 4"]),
    _case("train/device-gpu", _with(TRAIN, "--device", "gpu"),
          ["--device 'gpu': expected cpu, cuda, cuda:N or mps"]),
    _case("train/device-cpu-index", _with(TRAIN, "--device", "cpu:1"), ["--device 'cpu:1'"]),
    _case("train/device-cuda-99", _with(TRAIN, "--device", "cuda:99"), ["--device cuda:99"]),
    _case("train/epochs-text", _with(TRAIN, "--epochs", "two"), ["--epochs", "two"]),
    # every output apart from every input and every other output
    *[_case(f"train/checkpoint-dir-{name}", _with(TRAIN, "--checkpoint-every", "2",
                                                  "--checkpoint-dir", where), words)
      for name, where, words in (
          ("inside-data", "{data}/ck", ["--checkpoint-dir {data}/ck lies inside --data"]),
          ("is-target", "{target}", ["--checkpoint-dir {target} is the same path as --target"]),
          ("inside-target", "{target}/ck", ["--checkpoint-dir {target}/ck lies inside "
                                             "--target"]),
          ("is-out", "{new}", ["--out {new} is the same path as --checkpoint-dir {new}",
                               "must not overwrite an output"]),
          ("inside-out", "{new}/ck", ["--out {new} contains --checkpoint-dir {new}/ck"]),
          ("not-a-checkpoint-folder", "{hf}", ["--checkpoint-dir {hf}: holds 'config.json'",
                                               "not only `draft train` checkpoints"]))],
    _case("train/out-inside-checkpoint-dir", _with(
        TRAIN, "--out", "{tmp}/ck/head", "--checkpoint-every", "2", "--checkpoint-dir",
        "{tmp}/ck", drop=("--out",)), ["--out {tmp}/ck/head lies inside --checkpoint-dir"]),
    _case("train/default-checkpoint-dir-is-data", _with(
        TRAIN, "--out", "{tmp}/data-out", "--resume", drop=("--out",)),
        ["--checkpoint-dir (default) {tmp}/data-out.checkpoints is the same path as --data"],
        lambda p: p["data"].rename(p["tmp"] / "data-out.checkpoints"),
        lambda p: p.update(data=p["tmp"] / "data-out.checkpoints")),
    # resume: the checkpoint's run.json is read before any model is built
    _case("train/resume-run-json-list", _with(TRAIN, "--resume", "--checkpoint-dir", "{tmp}/ck"),
          ["step-000000002/run.json: holds a JSON list", "`draft train` checkpoint"],
          _put("ck/step-000000002/state.pt", b"x"), _put("ck/step-000000002/run.json", "[]")),
    _case("train/resume-no-run-json", _with(TRAIN, "--resume", "--checkpoint-dir", "{tmp}/ck"),
          ["step-000000002/run.json: not a `draft train` checkpoint's run record"],
          _put("ck/step-000000002/state.pt", b"x")),
    _case("train/resume-other-lr", _with(TRAIN, "--resume", "--checkpoint-dir", "{tmp}/ck"),
          ["step-000000002: run setting 'lr' was 0.5, now 0.001"],
          _put("ck/step-000000002/state.pt", b"x"),
          _put("ck/step-000000002/run.json", json.dumps({"lr": 0.5}))),
    _case("train/earlier-checkpoints-without-resume", _with(
        TRAIN, "--checkpoint-every", "2", "--checkpoint-dir", "{tmp}/ck"),
        ["holds checkpoints of an earlier run; pass --resume"],
        _put("ck/step-000000002/state.pt", b"x")),
    # the default folder (OUT.checkpoints) too: two runs must not prune or resume each
    # other's checkpoints there
    *[Case(f"train/earlier-checkpoints-in-the-default-folder-{how}", _with(TRAIN, *flags), 2,
           ("{new}.checkpoints: holds checkpoints of an earlier run; pass --resume",),
           _no_training(_put("new-out.checkpoints/step-000000002/state.pt", b"x")))
      for how, flags in (("checkpoint-every", ("--checkpoint-every", "2")),
                         ("validation", ("--checkpoint-every", "1", "--val-fraction", "0.25")))],
    # a damaged manifest: one line naming the field, never an internal error
    _case("train/manifest-list", TRAIN, ["manifest.json: holds a JSON list, expected an object"],
          _put("data/manifest.json", "[1]")),
    _case("train/manifest-capture-text", TRAIN,
          ["manifest.json: field 'capture' is 'done', expected an object"],
          _json_edit("data", "manifest.json", capture="done")),
    _case("train/manifest-shard-entry-index-text", TRAIN,
          ["manifest.json: field 'capture.samples[0]' is {'index': 'x'",
           "an integer 'index' >= 0"],
          lambda p: _edit_capture_entry(p["data"], 0, index="x")),
    _case("train/manifest-layer-ids-text", TRAIN,
          ["field 'capture.layer_ids' is '2,3,4,6', expected ascending layer ids"],
          lambda p: _edit_capture(p["data"], layer_ids="2,3,4,6")),
    _case("train/manifest-aux-ids-other", TRAIN,
          ["field 'capture.aux_layer_ids' is [1, 2], expected [2, 3, 4]"],
          lambda p: _edit_capture(p["data"], aux_layer_ids=[1, 2])),
    Case("train/world-size-without-torchrun", TRAIN, 2,
         ("WORLD_SIZE=2 is set but RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not",
          "torchrun --nproc-per-node 2"), lambda ws: _env_build(ws, WORLD_SIZE="2")),
    Case("train/world-size-text", TRAIN, 2, ("WORLD_SIZE='two'", "process count"),
         lambda ws: _env_build(ws, WORLD_SIZE="two")),
    # pointless work: nothing (or too little) left to train on
    _case("train/max-len-keeps-no-response-token", _with(TRAIN, "--ttt-steps", "1",
                                                         "--max-len", "3"),
          ["--max-len 3: keeps 0 of 24 response tokens", "--min-train-tokens 1",
           "nothing trained"]),
    _case("train/below-min-train-tokens", _with(TRAIN, "--min-train-tokens", "1000"),
          ["keeps 24 of 24 response tokens", "below --min-train-tokens 1000"]),
    # shards checked against the capture records before any work
    _case("train/shard-torn", TRAIN, ["hs_1.safetensors", "bytes, recorded"],
          lambda p: _truncate(p["data"] / "hidden_states" / "hs_1.safetensors")),
    _case("train/shard-garbage", TRAIN, ["hs_2.safetensors: unreadable safetensors header"],
          _put("data/hidden_states/hs_2.safetensors", b"not a shard")),
    _case("train/shard-one-token-short", TRAIN,
          ["hs_0.safetensors: hidden_states shape [9, 4, 64], expected [10, 4, 64]"],
          lambda p: _rewrite_shard(p["data"], 0, tokens=-1)),
    _case("train/shard-recorded-non-finite", TRAIN,
          ["1 bad hidden-state shard(s)", "hs_3.safetensors: holds NaN or infinite values "
           "(recorded by capture)"],
          lambda p: _record(p["data"], 3, finite=False)),
    _case("train/shard-rewritten-rehash", _with(TRAIN, "--rehash-shards"),
          ["hs_1.safetensors: sha256 differs from the recorded one"],
          lambda p: _rewrite_shard(p["data"], 1, nan=True)),
]


def _edit_capture(data: Path, **changes) -> None:
    path = data / "manifest.json"
    man = json.loads(path.read_text())
    man["capture"].update(changes)
    path.write_text(json.dumps(man))


def _edit_capture_entry(data: Path, pos: int, **changes) -> None:
    path = data / "manifest.json"
    man = json.loads(path.read_text())
    man["capture"]["samples"][pos].update(changes)
    path.write_text(json.dumps(man))


def _env_build(ws: Workspace, **env: str) -> dict[str, Path]:
    for name in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        ws.monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        ws.monkeypatch.setenv(name, value)
    return _inputs(ws)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def _rewrite_shard(data: Path, index: int, *, tokens: int = 0, nan: bool = False) -> None:
    """Shard ``index`` written again (same format), ``tokens`` longer/shorter or with a
    NaN (same size: only a re-hash sees it)."""
    import torch
    from safetensors.torch import load_file

    from vllm_kimi_ext.train import capture

    path = data / "hidden_states" / f"hs_{index}.safetensors"
    t = load_file(str(path))
    n = t["token_ids"].shape[0] + tokens
    hs, ids = t["hidden_states"][:n].clone(), t["token_ids"][:n].clone()
    if nan:
        hs[0, 0, 0] = float("nan")
    capture._save_shard(path, hs.to(torch.bfloat16), ids)


def _record(data: Path, index: int, **changes) -> None:
    """Change what the capture records say about shard ``index`` (its log line wins)."""
    log = data / "hidden_states" / "shards.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for rec in lines:
        if rec["index"] == index:
            rec.update(changes)
    log.write_text("".join(json.dumps(rec) + "\n" for rec in lines))

EVAL_CASES: list[Case] = [
    *_numbers("eval", EVAL, [
        ("-k", "0", "in [1, 64]"), ("-k", "-2", "in [1, 64]"), ("-k", "65", "in [1, 64]"),
        ("--holdout-every", "-5", ">= 0"), ("--max-len", "1", ">= 2"),
    ]),
    _case("eval/split-without-holdout", _with(EVAL, "--split", "heldout"),
          ["--split heldout: needs --holdout-every"]),
    _case("eval/split-train-without-holdout", _with(EVAL, "--split", "train"),
          ["--split train: needs --holdout-every"]),
    _case("eval/split-bogus", _with(EVAL, "--split", "test"), ["--split", "test"]),
    _case("eval/draft-twice", _with(EVAL, "--draft", "{head}"), ["--draft", "given twice"]),
    _case("eval/draft-missing", _with(EVAL, "--draft", "{missing}", drop=("--draft",)),
          ["--draft {missing}: no such folder"]),
    _case("eval/second-draft-missing", _with(EVAL, "--draft", "{missing}"),
          ["--draft {missing}: no such folder"]),
    _case("eval/draft-is-file", _with(EVAL, "--draft", "{file}", drop=("--draft",)),
          ["--draft {file}: is a file"]),
    _case("eval/draft-without-config", EVAL, ["--draft {head}: no config.json"],
          _drop("head", "config.json")),
    _case("eval/draft-remote-code", _with(EVAL, "--draft", "{remote}", drop=("--draft",)),
          ["--draft {remote}", "--trust-remote-code"], absent=("marker",)),
    _case("eval/target-remote-code", _with(EVAL, "--target", "{remote}", drop=("--target",)),
          ["--target {remote}", "--trust-remote-code"], absent=("marker",)),
    _case("eval/target-missing", _with(EVAL, "--target", "{missing}", drop=("--target",)),
          ["--target {missing}: no such folder"]),
    _case("eval/target-config-list", EVAL, ["--target", "holds a JSON list"],
          _put("target/config.json", "[]")),
    _case("eval/data-missing", _with(EVAL, "--data", "{missing}", drop=("--data",)),
          ["--data {missing}: no such folder"]),
    _case("eval/data-not-captured", EVAL, ["no capture section"],
          _drop("data", "manifest.json")),
    _case("eval/data-no-shards", EVAL, ["hs_0.safetensors: recorded by capture but missing"],
          _drop("data", "hidden_states")),
    _case("eval/data-other-target", EVAL, ["captured with hidden_size 64"],
          _json_edit("target", hidden_size=32)),
    _case("eval/k-text", _with(EVAL, "-k", "three"), ["-k", "three"]),
    _case("eval/k-longer-than-every-sample", _with(EVAL, "-k", "40"),
          ["-k 40 --max-len 16384: no chain of 40 response tokens fits any of the 4 samples",
           "nothing evaluated"]),
    _case("eval/max-len-leaves-no-position", _with(EVAL, "--max-len", "5"),
          ["-k 3 --max-len 5: no chain of 3 response tokens", "nothing evaluated"]),
    _case("eval/chunk-zero", _with(EVAL, "--chunk", "0"), ["--chunk", ">= 1"]),
    _case("eval/manifest-hidden-size-text", EVAL,
          ["field 'capture.hidden_size' is '64', expected an integer >= 1"],
          lambda p: _edit_capture(p["data"], hidden_size="64")),
    _case("eval/manifest-shard-bytes-text", EVAL,
          ["field 'capture.samples[1].bytes' is 'big', expected an integer >= 0"],
          lambda p: _edit_capture_entry(p["data"], 1, bytes="big")),
    _case("eval/shard-torn", EVAL, ["hs_1.safetensors", "bytes, recorded"],
          lambda p: _truncate(p["data"] / "hidden_states" / "hs_1.safetensors")),
    _case("eval/shard-rewritten-rehash", _with(EVAL, "--rehash-shards"),
          ["hs_2.safetensors: sha256 differs from the recorded one"],
          lambda p: _rewrite_shard(p["data"], 2, nan=True)),
]

BILL_CASES: list[Case] = [
    *_numbers("bill", BILL, [
        ("--prompts", "0", "expected an integer >= 1"), ("--prompts", "-5000", ">= 1"),
        ("--prompt-tokens", "0", "> 0"), ("--prompt-tokens", "-1", "> 0"),
        ("--prompt-tokens", "nan", "finite"), ("--response-tokens", "0", "> 0"),
        ("--response-tokens", "inf", "finite"), ("--decode-batch", "0", ">= 1"),
        ("--decode-batch", "-64", ">= 1"), ("--context", "0", ">= 1"),
        ("--decode-tok-s", "0", "> 0"), ("--decode-tok-s", "-100", "> 0"),
        ("--prefill-tok-s", "0", "> 0"), ("--prefill-tok-s", "nan", "finite"),
        ("--ttt-steps", "0", "in [1, 64]"), ("--epochs", "0", "> 0"), ("--epochs", "-1", "> 0"),
        ("--alt-step-cost", "0", "> 0"), ("--alt-step-cost", "-1", "> 0"),
        ("--disk-read-gb-s", "0", "> 0"), ("--disk-read-gb-s", "-7", "> 0"),
        ("--disk-read-gb-s", "nan", "finite"), ("--max-len", "1", ">= 2"),
    ]),
    *[_case(f"bill/measured-train-{name}", _with(BILL, "--measured-train", "{tmp}/t.json"),
            ["{tmp}/t.json", *words], _put("t.json", content))
      for name, content, words in (
          ("negative-rate", '{"tokens_per_s": -120.5}',
           ["field 'tokens_per_s' is -120.5, expected a finite number > 0"]),
          ("zero-rate", '{"tokens_per_s": 0}', ["field 'tokens_per_s' is 0"]),
          ("text-rate", '{"tokens_per_s": "fast"}', ["field 'tokens_per_s' is 'fast'"]),
          ("boolean-rate", '{"tokens_per_s": true}', ["field 'tokens_per_s' is True"]),
          ("list", "[1, 2]", ["holds a JSON list, expected training.json's object"]))],
    _case("bill/measured-generation-rate-text", _with(BILL, "--measured", "{data}"),
          ["manifest.json: field 'generation.measured.tokens_per_s' is 'x'"],
          _json_edit("data", "manifest.json", generation={"measured": {"tokens_per_s": "x"}})),
    _case("bill/measured-capture-seconds-negative", _with(BILL, "--measured", "{data}"),
          ["manifest.json: field 'capture.measured.seconds' is -3"],
          lambda p: _edit_capture(p["data"], measured={"tokens": 10, "seconds": -3})),
    _case("bill/measured-capture-not-object", _with(BILL, "--measured", "{data}"),
          ["manifest.json: field 'capture' is 'done', expected an object"],
          _json_edit("data", "manifest.json", capture="done")),
    _case("bill/clean-disk-bound", _with(BILL, "--disk-read-gb-s", "0.01"),
          ["DISK-BOUND: the shard store, not the GPUs, bounds training"], code=0),
    *[_case(f"bill/gain-fraction-{v}", _with(BILL, "--gain-fraction", v, drop=("--prompts",)),
            ["--gain-fraction", "in (0, 1)"]) for v in ("0", "1", "1.5", "-0.1", "nan")],
    _case("bill/n-half-zero", _with(BILL, "--gain-fraction", "0.5", "--n-half", "0",
                                    drop=("--prompts",)), ["--n-half 0", "> 0"]),
    _case("bill/n-half-negative", _with(BILL, "--gain-fraction", "0.5", "--n-half", "-7",
                                        drop=("--prompts",)), ["--n-half -7"]),
    _case("bill/n-half-without-gain-fraction", _with(BILL, "--n-half", "1000"),
          ["--n-half applies to --gain-fraction only"]),
    _case("bill/neither-size", _with(BILL, drop=("--prompts",)),
          ["exactly one of --prompts, --gain-fraction"]),
    _case("bill/both-sizes", _with(BILL, "--gain-fraction", "0.5"),
          ["exactly one of --prompts, --gain-fraction"]),
    _case("bill/tau-below-one", _with(BILL, "--tau-now", "0.5", "--tau-after", "2"),
          ["--tau-now 0.5", ">= 1"]),
    _case("bill/tau-after-nan", _with(BILL, "--tau-now", "1.5", "--tau-after", "nan"),
          ["--tau-after", "finite"]),
    _case("bill/tau-now-alone", _with(BILL, "--tau-now", "1.5"), ["--tau-after is needed"]),
    _case("bill/tau-after-alone", _with(BILL, "--tau-after", "1.5"), ["--tau-now is needed"]),
    _case("bill/tau-alt-alone", _with(BILL, "--tau-alt", "1.5"),
          ["--tau-alt needs --tau-now and --tau-after"]),
    _case("bill/measured-missing", _with(BILL, "--measured", "{missing}"),
          ["--measured {missing}: no such folder"]),
    _case("bill/measured-is-file", _with(BILL, "--measured", "{file}"),
          ["--measured {file}: is a file"]),
    _case("bill/measured-without-samples", _with(BILL, "--measured", "{head}"),
          ["--measured {head}: no samples.jsonl"]),
    _case("bill/measured-train-missing", _with(BILL, "--measured-train", "{missing}"),
          ["--measured-train {missing}: no such file"]),
    _case("bill/measured-train-is-folder", _with(BILL, "--measured-train", "{data}"),
          ["--measured-train {data}: is a folder"]),
    _case("bill/measured-train-not-json", _with(BILL, "--measured-train", "{file}"),
          ["--measured-train {file}"], _put("prompts.jsonl", "{")),
    _case("bill/hardware-unknown", ("draft", "bill", "--prompts", "10", "--hardware", "bogus"),
          ["cost model unavailable for 'bogus'", "--decode-tok-s"]),
    _case("bill/prompts-text", _with(BILL, "--prompts", "many", drop=("--prompts",)),
          ["--prompts", "many"]),
    # clean: the checks refuse nothing they should accept, and --json is strict
    _case("bill/clean-json-with-infinite-payback", _with(
        BILL, "--tau-now", "2", "--tau-after", "1.5", "--json"),
        ['"payback_hours_vs_today": null'], code=0),
    _case("bill/clean-gain-fraction", _with(BILL, "--gain-fraction", "0.5", "--n-half", "10",
                                            drop=("--prompts",)), ["traffic: 10 prompts"],
          code=0),
    _case("bill/clean-measured", _with(BILL, "--measured", "{data}", "--json"),
          ['"prompt_tokens": 4.0'], code=0),
]


def _env_entry(argv: list[str]) -> int:
    """What `vllm serve` does first with the variables ``argv`` sets (NAME=VALUE):
    vLLM calls the plugin's register(); its refusal is ``SystemExit`` and a line on
    stderr, its warnings go to the plugin's logger (shown on stderr here)."""
    from vllm_kimi_ext import plugin

    handler = logging.StreamHandler(_StderrProxy())
    log = logging.getLogger("vllm_kimi_ext")
    log.addHandler(handler)
    saved = {k: os.environ.get(k) for k in os.environ if k.startswith(envs.PREFIX)}
    try:
        for k in saved:
            del os.environ[k]
        for item in argv:
            name, _, value = item.partition("=")
            os.environ[name] = value
        plugin.check_environment()
        return 0
    except SystemExit as exc:
        return int(exc.code)
    finally:
        log.removeHandler(handler)
        for item in argv:
            os.environ.pop(item.partition("=")[0], None)
        os.environ.update({k: v for k, v in saved.items() if v is not None})


class _StderrProxy:
    def write(self, text: str) -> None:
        import sys

        sys.stderr.write(text)

    def flush(self) -> None:
        pass


def _env(id_: str, settings: tuple[str, ...], code: int, words) -> Case:
    return Case(f"env/{id_}", settings, code, tuple(words), lambda ws: {}, entry=_env_entry)


_ON = envs.ENABLE.name + "=1"
ENV_CASES: list[Case] = [
    *[_env(f"{flag.name.lower()}-{raw or 'blank'}", (_ON, f"{flag.name}={raw}"), 2,
           [f"{flag.name}={raw!r}: expected", "one of 1/true/yes/on"])
      for flag in envs.FLAGS if flag.kind == "bool" and flag is not envs.ENABLE
      for raw in ("maybe", "2", "ture")],
    *[_env(f"count-collectives-{raw}", (_ON, f"{envs.COUNT_COLLECTIVES.name}={raw}"), 2,
           [f"{envs.COUNT_COLLECTIVES.name}={raw!r}", "a step interval N >= 0"])
      for raw in ("abc", "-5", "2.5")],
    _env("enable-maybe", (envs.ENABLE.name + "=maybe",), 2, [f"{envs.ENABLE.name}='maybe'"]),
    _env("enable-yes-please", (envs.ENABLE.name + "=yes please",), 2, ["'yes please'"]),
    *[_env(f"misspelt-{flag.name.lower()}", (_ON, f"{flag.name}S=1"), 0,
           [f"{flag.name}S is not a vllm-kimi-ext variable", f"did you mean {flag.name}?"])
      for flag in envs.FLAGS if flag is not envs.ENABLE],
    _env("misspelt-enable-while-off", (envs.ENABLE.name + "T=1",), 0,
         [f"{envs.ENABLE.name}T is not a vllm-kimi-ext variable",
          f"did you mean {envs.ENABLE.name}?"]),
    _env("clean-all-valid", (_ON, envs.SHARDED_VERIFY.name + "=on",
                             envs.COUNT_COLLECTIVES.name + "=50"), 0, []),
    # numbers: ASCII digits, bounded (Python's int() reads the first three)
    *[_env(f"{flag.name.lower()}-{what}", (_ON, envs.SHARDED_VERIFY.name + "=1",
                                           f"{flag.name}={raw}"), 2,
           [f"{flag.name}={raw!r}: expected", "ASCII digits", *more])
      for flag in (envs.COUNT_COLLECTIVES, envs.SHARDED_VERIFY_HANDOFF)
      for what, raw, more in (("underscore", "1_000", ()), ("arabic-indic-digit", "\u0663", ()),
                              ("plus", "+4", ()),
                              ("26-digits", "9" * 26, (f"N must be <= {envs.MAX_COUNT}",)))],
    _env("handoff-empty-is-off", (_ON, envs.SHARDED_VERIFY.name + "=1",
                                  envs.SHARDED_VERIFY_HANDOFF.name + "="), 0, []),
    # a setting that does nothing without its parent: one warning line naming both
    _env("handoff-without-sharded-verify", (_ON, envs.SHARDED_VERIFY_HANDOFF.name + "=4"), 0,
         [f"{envs.SHARDED_VERIFY_HANDOFF.name}='4' has no effect without "
          f"{envs.SHARDED_VERIFY.name}=1 and is ignored"]),
    _env("graphs-with-sharded-verify-off", (_ON, envs.SHARDED_VERIFY.name + "=0",
                                            envs.SHARDED_VERIFY_GRAPHS.name + "=off"), 0,
         [f"{envs.SHARDED_VERIFY_GRAPHS.name}='off' has no effect without "
          f"{envs.SHARDED_VERIFY.name}=1"]),
    _env("sharded-verify-without-enable", (envs.SHARDED_VERIFY.name + "=1",), 0,
         [f"{envs.SHARDED_VERIFY.name}='1' has no effect without {envs.ENABLE.name}=1"]),
    _env("invalid-handoff-while-off", (envs.SHARDED_VERIFY_HANDOFF.name + "=1_000",), 0,
         [f"{envs.SHARDED_VERIFY_HANDOFF.name}='1_000' has no effect without "
          f"{envs.ENABLE.name}=1"]),
]

CASES_BY_TOOL = {"regenerate": REGENERATE_CASES, "capture": CAPTURE_CASES,
                 "train": TRAIN_CASES, "eval": EVAL_CASES, "bill": BILL_CASES, "env": ENV_CASES}
ALL_CASES = [c for cases in CASES_BY_TOOL.values() for c in cases]

# --------------------------------------------------------------------------- #
# Running                                                                      #
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="session")
def train_bases(tmp_path_factory) -> TrainBases:
    pytest.importorskip("torch")
    return TrainBases(tmp_path_factory.mktemp("bad-input-train-bases"))


def _tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` -> sha256 of its bytes ("dir" / "link -> X")."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"link -> {os.readlink(p)}"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input(case, train_bases, tmp_path, monkeypatch):
    from vllm_kimi_ext.cli import main

    paths = {k: str(v) for k, v in case.build(Workspace(tmp_path, train_bases,
                                                         monkeypatch)).items()}
    before = _tree(tmp_path)
    argv = [_fill(a, paths) for a in case.argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = (case.entry or main)(argv)
    result = Result(code, out.getvalue(), err.getvalue(), argv, paths)
    shown = f"argv {result.argv}\n--- stdout\n{result.out}\n--- stderr\n{result.err}"
    assert result.code == case.code, shown
    for word in case.words:
        word = _fill(word, paths)
        assert word in result.text, f"{word!r} missing\n{shown}"
    assert "Traceback" not in result.text, shown
    assert "internal error" not in result.text, shown
    if case.code == 2:  # one line on stderr, the command's "error:" line
        lines = [ln for ln in result.err.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ": error: " in ln]
        assert len(errors) == 1, f"not one error line\n{shown}"
        assert all(ln.startswith("usage:") or ln.startswith(" ") or ln == errors[0]
                   for ln in lines), f"more than the error line\n{shown}"
    for name in case.absent:
        assert not Path(result.paths[name]).exists(), f"{name} was written\n{shown}"
    assert _tree(tmp_path) == before, f"inputs changed or something was written\n{shown}"
    if "--json" in result.argv and case.code == 0:
        json.loads(result.out, parse_constant=_refuse_constant)


def _fill(text: str, paths: dict[str, str]) -> str:
    """``text`` with each ``{name}`` of ``paths`` replaced (other braces kept: JSON)."""
    for name, path in paths.items():
        text = text.replace("{" + name + "}", path)
    return text


def _refuse_constant(name: str):
    raise AssertionError(f"--json output holds {name}: not strict JSON")


def test_the_table_has_at_least_150_cases_with_unique_ids():
    ids = [c.id for c in ALL_CASES]
    assert len(ids) >= 150, len(ids)
    assert len(set(ids)) == len(ids), sorted(i for i in ids if ids.count(i) > 1)
    for tool, cases in CASES_BY_TOOL.items():
        assert all(c.tool == tool for c in cases), tool
        assert len(cases) >= 10, tool


def test_every_number_rule_has_a_case():
    """Each row of validate.NUMBERS is exercised by at least one case of its command (a
    flag added to the table without a case fails here)."""
    from vllm_kimi_ext.train.validate import NUMBERS, flag_name

    missing = [f"{cmd} {flag_name(dest)}" for cmd, rules in NUMBERS.items() for dest in rules
               if not any(flag_name(dest) in c.argv for c in CASES_BY_TOOL[cmd])]
    assert missing == []


def test_remote_code_would_have_run_without_the_check(train_bases, tmp_path):
    """The marker folder is live: transformers with trust_remote_code=True imports its
    code, which writes the marker (so the cases' `marker absent` proves the refusal)."""
    from transformers import AutoConfig

    ws = Workspace(tmp_path, train_bases)
    paths = _inputs(ws)
    with contextlib.redirect_stderr(io.StringIO()):
        with pytest.raises(Exception):  # noqa: B017 - the stub's classes do not exist
            AutoConfig.from_pretrained(paths["remote"], trust_remote_code=True)
    assert paths["marker"].exists()

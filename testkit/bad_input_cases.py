"""The bad-input table: what a user can pass to each tool, and what must come back.

One list per tool (:data:`CASES_BY_TOOL`); ``tests/unit/test_bad_input.py`` runs every
case in-process and checks the exit code, the words, the doctor codes, that nothing
half-written is left and that no traceback is printed. To cover another tool, add a
list here (``PLAN_CASES`` and ``BENCH_RUNNER_CASES`` are waiting: a bench runner with its
own ``main(argv) -> int`` passes it as ``Case(entry=...)``) and register it in
:data:`CASES_BY_TOOL`.

Every doctor finding code must be triggered by at least one case here (checked
against :data:`vllm_kimi_ext.drafts.doctor.codes.FINDING_CODES`).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from .bad_input import (
    DROP,
    REDUCED_VOCAB,
    TARGET_LAYERS,
    TARGET_RANKS,
    Case,
    Workspace,
    edit_config,
    edit_tensors,
    write_safetensors_raw,
)

__all__ = ["ALL_CASES", "CASES_BY_TOOL"]

VOCAB = TARGET_RANKS + 256
HIDDEN = 64  # TinyKimiSpec.hidden_size


def _torch():
    import torch

    return torch


# --------------------------------------------------------------------------- #
# doctor                                                                       #
# --------------------------------------------------------------------------- #

DOCTOR = ("doctor", "--target", "{target}", "--draft", "{draft}", "--json")


def _pair(draft="eagle3", edit=None, target_edit=None, target="target", draft_name="draft"):
    """Build: the shared target (a copy when edited) and an edited copy of a draft base."""

    def build(ws: Workspace) -> dict:
        t = ws.base(target) if target_edit is None else ws.copy(target, "target")
        if target_edit is not None:
            target_edit(t)
        d = ws.copy(draft, draft_name)
        if edit is not None:
            edit(d)
        return {"target": t, "draft": d}

    return build


def _cfg(file: str = "config.json", **changes):
    return lambda d: edit_config(d, file, **changes)


def _tensors(drop=(), **replace):
    return lambda d: edit_tensors(d, tuple(drop), **replace)


def _write(name: str, content):
    def edit(d: Path) -> None:
        (d / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return edit


def _remove(name: str):
    return lambda d: (d / name).unlink()


def _truncate(fraction: float):
    def edit(d: Path) -> None:
        f = d / "model.safetensors"
        data = f.read_bytes()
        f.write_bytes(data[: int(len(data) * fraction)])
    return edit


def _raw_weights(header, data: bytes = b"", header_len=None):
    return lambda d: write_safetensors_raw(d / "model.safetensors", header, data, header_len)


def _doctor(id_, build, code, words, codes=(), extra=()):
    return Case(f"doctor/{id_}", DOCTOR + tuple(extra), code, tuple(words), build, tuple(codes))


def _d2t(fn):
    """Replace d2t by ``fn(current d2t)``."""
    return _tensors(d2t=lambda t: fn(t.clone()))


def _set(t, i, v):
    t[i] = v
    return t


DOCTOR_CASES: list[Case] = [
    # -- clean inputs: the suite also shows what passes
    _doctor("clean-eagle3", _pair(), 0, ['"ok": true', '"findings": []']),
    _doctor("clean-reduced-eagle3", _pair("eagle3-reduced"), 0, ['"ok": true']),
    _doctor("clean-dflash", _pair("dflash"), 0, ['"ok": true'], extra=("--method", "dflash")),
    _doctor("clean-mtp-in-target", _pair("mtp", target="mtp"), 0, ['"findings": []'],
            extra=("--method", "mtp")),
    _doctor("max-model-len-replaces-target-length",
            _pair(target_edit=_cfg(**{"text_config.max_position_embeddings": DROP})), 0,
            ['"ok": true'], extra=("--max-model-len", "4096")),
    # -- unreadable configs: no verdict, exit 2
    _doctor("draft-dir-missing", lambda ws: {"target": ws.base("target"),
                                             "draft": ws.tmp / "nope"},
            2, ["no config.json", "does not exist"], ["E-CONFIG"]),
    _doctor("draft-no-config-json", _pair(edit=_remove("config.json")), 2,
            ["no config.json"], ["E-CONFIG"]),
    _doctor("target-config-not-json", _pair(target_edit=_write("config.json", "{not json")), 2,
            ["not valid JSON"], ["E-CONFIG"]),
    _doctor("draft-config-json-list", _pair(edit=_write("config.json", "[1, 2]")), 2,
            ["holds a JSON list", "expected an object"], ["E-CONFIG"]),
    _doctor("draft-config-not-utf8", _pair(edit=_write("config.json", b'{"a": "\xff\xfe"}')), 2,
            ["not UTF-8"], ["E-CONFIG"]),
    # -- config values of the wrong type: named file, field, expectation
    _doctor("architectures-as-string", _pair(edit=_cfg(architectures="LlamaForCausalLMEagle3")),
            1, ["architectures must be a non-empty list of class names",
                "'LlamaForCausalLMEagle3' (str)"], ["E-CONFIG-TYPE"]),
    _doctor("vocab-size-as-string", _pair(edit=_cfg(vocab_size=str(VOCAB))), 1,
            ["vocab_size must be a positive integer", f"'{VOCAB}' (str)"], ["E-CONFIG-TYPE"]),
    _doctor("hidden-size-negative", _pair(edit=_cfg(hidden_size=-64)), 1,
            ["hidden_size must be a positive integer, got -64"], ["E-CONFIG-TYPE"]),
    _doctor("num-hidden-layers-bool", _pair(edit=_cfg(num_hidden_layers=True)), 1,
            ["num_hidden_layers must be a positive integer, got True (bool)"],
            ["E-CONFIG-TYPE"]),
    _doctor("rope-factor-string", _pair(edit=_cfg(**{"rope_scaling.factor": "two"})), 1,
            ["rope_scaling.factor must be a positive finite number"], ["E-CONFIG-TYPE"]),
    _doctor("rope-theta-nan", _pair(edit=lambda d: (d / "config.json").write_text(
        (d / "config.json").read_text().replace('"rope_theta": 50000.0', '"rope_theta": NaN'))),
        1, ["rope_theta must be a positive finite number, got nan"], ["E-CONFIG-TYPE"]),
    _doctor("eos-id-string", _pair(edit=_cfg(eos_token_id="eos")), 1,
            ["eos_token_id must be a token id, a list of token ids, or null"],
            ["E-CONFIG-TYPE"]),
    _doctor("aux-ids-as-string", _pair(edit=_cfg(eagle_aux_hidden_state_layer_ids="1,2,3")), 1,
            ["eagle_aux_hidden_state_layer_ids must be a list of integers"], ["E-CONFIG-TYPE"]),
    _doctor("draft-vocab-size-zero", _pair(edit=_cfg(draft_vocab_size=0)), 1,
            ["draft_vocab_size must be a positive integer, got 0"], ["E-CONFIG-TYPE"]),
    _doctor("max-position-float", _pair(edit=_cfg(max_position_embeddings=8192.0)), 1,
            ["max_position_embeddings must be a positive integer, got 8192.0 (float)"],
            ["E-CONFIG-TYPE"]),
    _doctor("target-text-config-list", _pair(target_edit=_cfg(text_config=[1])), 1,
            ["text_config must be an object"], ["E-CONFIG-TYPE", "E-CONFIG-MISSING"]),
    _doctor("dflash-config-string", _pair("dflash", edit=_cfg(dflash_config="yes")), 1,
            ["dflash_config must be an object"], ["E-CONFIG-TYPE"], extra=("--method", "dflash")),
    _doctor("quant-config-group-string", _pair("mtp", target="mtp", edit=_cfg(
        quantization_config={"quant_method": "compressed-tensors",
                             "config_groups": {"group_0": "Linear"}})), 1,
        ["quantization_config.config_groups.group_0 must be an object"], ["E-CONFIG-TYPE"],
        extra=("--method", "mtp")),
    # -- fields a check needs: never skipped silently
    _doctor("target-without-vocab-size", _pair("eagle3-reduced", target_edit=_cfg(**{
        "text_config.vocab_size": DROP, "vocab_size": DROP})), 1,
        ["target", "has no vocab_size", "d2t"], ["E-CONFIG-MISSING"]),
    _doctor("target-config-empty-object", _pair(target_edit=_write("config.json", "{}")), 1,
            ["has no vocab_size", "has no hidden_size", "has no num_hidden_layers"],
            ["E-CONFIG-MISSING"]),
    _doctor("target-without-hidden-size",
            _pair(target_edit=_cfg(**{"text_config.hidden_size": DROP})), 1,
            ["has no hidden_size", "fc width"], ["E-CONFIG-MISSING"]),
    _doctor("draft-config-empty-object-eagle3", _pair(edit=_write("config.json", "{}")), 1,
            ["has no architectures", "has no vocab_size"], ["E-CONFIG-MISSING"],
            extra=("--method", "eagle3")),
    _doctor("draft-config-empty-object-auto", _pair(edit=_write("config.json", "{}")), 1,
            ["cannot tell the speculative method", "--method"],
            ["E-METHOD-UNKNOWN", "E-CONFIG-MISSING"]),
    _doctor("draft-without-max-position", _pair(edit=_cfg(max_position_embeddings=DROP)), 1,
            ["has no max_position_embeddings", "default"], ["E-CONFIG-MISSING"]),
    _doctor("draft-without-max-position-cache-only-rope", _pair(edit=_cfg(
        max_position_embeddings=DROP, rope_scaling=DROP)), 0, ['"ok": true']),
    # -- weight files
    _doctor("no-safetensors", _pair(edit=_remove("model.safetensors")), 1,
            ["no *.safetensors weight file"], ["E-WEIGHTS-MISSING"]),
    _doctor("pytorch-bin-only", _pair(edit=lambda d: os.rename(
        d / "model.safetensors", d / "pytorch_model.bin")), 1,
        ["found pytorch_model.bin", "safetensors headers only"], ["E-WEIGHTS-MISSING"]),
    _doctor("index-names-absent-file", _pair(edit=_write(
        "model.safetensors.index.json",
        json.dumps({"weight_map": {"fc.weight": "model-00002-of-00002.safetensors"}}))), 1,
        ["model-00002-of-00002.safetensors", "absent"], ["E-WEIGHTS-MISSING"]),
    _doctor("index-not-json", _pair(edit=_write("model.safetensors.index.json", "{")), 1,
            ["model.safetensors.index.json is not valid JSON"], ["E-WEIGHTS-INDEX"]),
    _doctor("index-without-weight-map", _pair(edit=_write("model.safetensors.index.json", "{}")),
            1, ["weight_map is missing"], ["E-WEIGHTS-INDEX"]),
    _doctor("weights-truncated-half", _pair(edit=_truncate(0.5)), 1,
            ["truncated", "data offsets need exactly"], ["E-WEIGHTS-SIZE"]),
    _doctor("weights-extra-bytes", _pair(edit=lambda d: open(
        d / "model.safetensors", "ab").write(b"\0" * 16)), 1,
        ["longer than its header says"], ["E-WEIGHTS-SIZE"]),
    _doctor("weights-nan-in-fc", _pair(edit=_tensors(
        **{"fc.weight": lambda t: _set(t.clone(), (0, 3), float("nan"))})), 1,
        ["tensor fc.weight holds NaN or infinite values", "element 3"],
        ["E-WEIGHTS-NONFINITE"]),
    _doctor("weights-inf-in-two-tensors", _pair(edit=_tensors(
        **{"fc.weight": lambda t: _set(t.clone(), (1, 0), float("inf")),
           "lm_head.weight": lambda t: _set(t.clone(), (0, 0), float("-inf"))})), 1,
        ["2 tensors in all", "lm_head.weight"], ["E-WEIGHTS-NONFINITE"]),
    _doctor("weights-random-bytes", _pair(edit=_write("model.safetensors", os.urandom(64) * 4)),
            1, ["does not fit the file"], ["E-WEIGHTS-HEADER"]),
    _doctor("weights-shorter-than-8-bytes", _pair(edit=_write("model.safetensors", b"\1\2")), 1,
            ["shorter than the 8-byte header length"], ["E-WEIGHTS-HEADER"]),
    _doctor("weights-header-not-json", _pair(edit=_raw_weights(b"{oops")), 1,
            ["header is not JSON"], ["E-WEIGHTS-HEADER"]),
    _doctor("weights-header-list", _pair(edit=_raw_weights([1, 2])), 1,
            ["header is list, expected a JSON object"], ["E-WEIGHTS-HEADER"]),
    _doctor("weights-entry-without-dtype", _pair(edit=_raw_weights(
        {"fc.weight": {"shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4)), 1,
        ["tensor 'fc.weight': dtype None"], ["E-WEIGHTS-HEADER"]),
    _doctor("weights-offsets-vs-shape", _pair(edit=_raw_weights(
        {"fc.weight": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 8]}}, b"\0" * 8)), 1,
        ["span 8 bytes but BF16 x [4, 4] needs 32"], ["E-WEIGHTS-HEADER"]),
    _doctor("weights-overlapping-offsets", _pair(edit=_raw_weights(
        {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
         "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, b"\0" * 6)), 1,
        ["overlaps the previous tensor"], ["E-WEIGHTS-HEADER"]),
    _doctor("weights-unknown-dtype", _pair(edit=_raw_weights(
        {"fc.weight": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, b"\0" * 16)), 1,
        ["'F128' is not a safetensors dtype"], ["E-WEIGHTS-HEADER"]),
    _doctor("weights-metadata-not-object", _pair(edit=_raw_weights({"__metadata__": [1]})), 1,
            ["__metadata__ is list"], ["E-WEIGHTS-HEADER"]),
    # -- what the draft is
    _doctor("target-as-draft", lambda ws: {"target": ws.base("target"),
                                           "draft": ws.base("target")}, 1,
            ["is the target checkpoint itself", "cannot tell the speculative method"],
            ["E-DRAFT-IS-TARGET", "E-METHOD-UNKNOWN"]),
    _doctor("target-as-draft-method-eagle3", lambda ws: {"target": ws.base("target"),
                                                         "draft": ws.base("target")}, 1,
            ["is the target checkpoint itself", "Eagle3KimiK25ForConditionalGeneration",
             "no fc weight"], ["E-DRAFT-IS-TARGET", "E-DRAFT-ARCH", "E-DRAFT-NO-FC"],
            extra=("--method", "eagle3")),
    _doctor("target-copy-as-draft-method-dflash", _pair("target"), 1,
            ["is the target checkpoint itself", "same architecture"],
            ["E-DRAFT-IS-TARGET", "E-DRAFT-ARCH"], extra=("--method", "dflash")),
    _doctor("target-and-draft-swapped", lambda ws: {"target": ws.base("eagle3"),
                                                    "draft": ws.base("target")}, 1,
            ["is a draft, not a target model", "swapped"], ["E-TARGET-IS-DRAFT"]),
    _doctor("eagle-head-as-draft-model", _pair(), 1,
            ["needs an ordinary causal LM", "an fc weight"], ["E-DRAFT-ARCH"],
            extra=("--method", "draft_model")),
    _doctor("eagle3-unknown-architecture", _pair(edit=_cfg(architectures=["BertModel"])), 1,
            ["'Eagle3BertModel'", "which it does not have"], ["E-DRAFT-ARCH"],
            extra=("--method", "eagle3")),
    _doctor("eagle3-without-fc", _pair(edit=_tensors(drop=["fc.weight"])), 1,
            ["no fc weight"], ["E-DRAFT-NO-FC"]),
    _doctor("dflash-without-fc", _pair("dflash", edit=_tensors(drop=["fc.weight"])), 1,
            ["no fc weight", "method dflash"], ["E-DRAFT-NO-FC"], extra=("--method", "dflash")),
    _doctor("deepseek-v3-typed-head", _pair(edit=_cfg(model_type="deepseek_v3",
                                                      architectures=["DeepseekV3ForCausalLM"])),
            1, ["Eagle3DeepSeekMTPModel", "name an EAGLE-3 architecture"],
            ["E-ARCH-MTP-REWRITE"], extra=("--method", "eagle3")),
    # -- context and positions (warnings: exit 0)
    _doctor("short-yarn-context", _pair(edit=_cfg(max_position_embeddings=8192)), 0,
            ["max_position_embeddings=8192", "lowers max_model_len"], ["W-CONTEXT-CAP"]),
    _doctor("rope-theta-differs", _pair(edit=_cfg(rope_theta=10000.0)), 0,
            ["rope_theta=10000.0"], ["W-ROPE-THETA"]),
    _doctor("rope-factor-differs", _pair(edit=_cfg(**{"rope_scaling.factor": 32.0})), 0,
            ["factor 32.0 vs 64.0"], ["W-ROPE-SCALING"]),
    # -- hidden states
    _doctor("aux-count", _pair(edit=_cfg(eagle_aux_hidden_state_layer_ids=[1, 3])), 1,
            ["num_aux_hidden_states=3 but 2 aux layer ids"], ["E-AUX-COUNT"]),
    _doctor("fc-width", _pair(edit=_tensors(
        **{"fc.weight": lambda t: _torch().zeros(HIDDEN, 2 * HIDDEN, dtype=t.dtype)})), 1,
        [f"input width {2 * HIDDEN}", f"builds it for {3 * HIDDEN}"], ["E-FC-WIDTH"]),
    _doctor("aux-id-out-of-range", _pair(edit=_cfg(eagle_aux_hidden_state_layer_ids=[2, 30, 58])),
            1, ["[30, 58]", f"{TARGET_LAYERS} layers"], ["E-AUX-RANGE"]),
    _doctor("aux-ids-ignored-agree", _pair(edit=_cfg(**{
        "eagle_config.eagle_aux_hidden_state_layer_ids": [2, 3, 3]})), 0,
        ["does not read", "agree"], ["W-AUX-IDS-IGNORED"]),
    _doctor("aux-ids-ignored-differ", _pair(edit=_cfg(**{
        "eagle_config.eagle_aux_hidden_state_layer_ids": [1, 2, 4]})), 1,
        ["taps its defaults [2, 3, 3]"], ["E-AUX-IDS-IGNORED"]),
    _doctor("hidden-mismatch", _pair(edit=_cfg(target_hidden_size=128)), 1,
            ["target_hidden_size=128", f"hidden_size is {HIDDEN}"], ["E-HIDDEN-MISMATCH"]),
    # -- vocabulary
    _doctor("vocab-mismatch", _pair(edit=_cfg(vocab_size=VOCAB + 2, draft_vocab_size=VOCAB)), 1,
            [f"vocab_size={VOCAB + 2}"], ["E-VOCAB-MISMATCH"]),
    _doctor("reduced-without-d2t", _pair("eagle3-reduced", edit=_tensors(drop=["d2t", "t2d"])),
            1, [f"draft_vocab_size={REDUCED_VOCAB}", "all-zero"], ["E-D2T-MISSING"]),
    _doctor("d2t-float", _pair("eagle3-reduced", edit=_d2t(lambda t: t.float())), 1,
            ["d2t has dtype F32"], ["E-D2T-DTYPE"]),
    _doctor("d2t-short", _pair("eagle3-reduced", edit=_d2t(lambda t: t[:-1])), 1,
            [f"({REDUCED_VOCAB - 1},)", f"({REDUCED_VOCAB},)"], ["E-D2T-SHAPE"]),
    _doctor("d2t-out-of-range", _pair("eagle3-reduced", edit=_d2t(
        lambda t: _set(t, 5, VOCAB))), 1, [f"draft id 5 -> {5 + VOCAB}"], ["E-D2T-RANGE"]),
    _doctor("d2t-all-to-one-target", _pair("eagle3-reduced", edit=_d2t(
        lambda t: 5 - _torch().arange(t.numel(), dtype=t.dtype))), 1,
        ["onto only 1 distinct target ids", "-> target id 5"], ["E-D2T-DUPLICATE"]),
    _doctor("t2d-disagrees", _pair("eagle3-reduced", edit=_tensors(
        t2d=lambda t: _set(t, int((~t).nonzero()[0]), True))), 1,
        ["marked but not mapped"], ["E-T2D-MISMATCH"]),
    _doctor("t2d-wrong-shape", _pair("eagle3-reduced", edit=_tensors(
        t2d=lambda t: t[:-3].clone())), 1, [f"expected BOOL ({VOCAB},)"], ["E-T2D-MISMATCH"]),
    _doctor("lm-head-rows", _pair("eagle3-reduced", edit=_cfg(draft_vocab_size=400)), 1,
            [f"has {REDUCED_VOCAB} rows but draft_vocab_size is 400"], ["E-LM-HEAD-ROWS"]),
    _doctor("eos-outside-vocab", _pair(edit=_cfg(eos_token_id=[TARGET_RANKS + 1, VOCAB + 5])), 1,
            ["eos_token_id", str(VOCAB + 5)], ["E-SPECIAL-ID"]),
    _doctor("pad-outside-vocab", _pair(edit=_cfg(pad_token_id=VOCAB)), 0,
            ["pad_token_id"], ["W-PAD-ID"]),
    # -- DFlash
    _doctor("dflash-mask-id-missing", _pair("dflash", edit=_cfg(
        **{"dflash_config.mask_token_id": DROP})), 1, ["mask_token_id=None"],
        ["E-DFLASH-MASK-ID"], extra=("--method", "dflash")),
    _doctor("dflash-mask-id-out-of-range", _pair("dflash", edit=_cfg(
        **{"dflash_config.mask_token_id": VOCAB})), 1, [f"mask_token_id={VOCAB}"],
        ["E-DFLASH-MASK-ID"]),
    _doctor("dflash-yarn-factor-from-mscale", _pair("dflash", edit=_cfg(rope_scaling={
        "rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 64,
        "mscale": 1.0, "mscale_all_dim": 1.0})), 0,
            ["attention factor 1.0000", "z-lab/Kimi-K2.5-DFlash", "draft rope-config"],
            ["W-ROPE-YARN-FACTOR"], extra=("--method", "dflash")),
    _doctor("dflash-without-block-size", _pair("dflash", edit=_cfg(block_size=DROP)), 1,
            ["declares no block_size"], ["E-DFLASH-BLOCK"], extra=("--method", "dflash")),
    # -- MTP
    _doctor("mtp-without-layers", lambda ws: {"target": ws.base("target"),
                                              "draft": ws.base("target")}, 1,
            ["num_nextn_predict_layers=0", "second full target"], ["E-MTP-NO-LAYERS"],
            extra=("--method", "mtp")),
    _doctor("mtp-tensor-missing", _pair("mtp", target="mtp", edit=_tensors(
        drop=["language_model.model.layers.2.hnorm.weight"])), 1,
        ["layers.2.hnorm.weight"], ["E-MTP-TENSORS-MISSING"], extra=("--method", "mtp")),
    _doctor("mtp-shape", _pair("mtp", target="mtp", edit=_tensors(**{
        "language_model.model.layers.2.eh_proj.weight":
            lambda t: _torch().zeros(HIDDEN, HIDDEN, dtype=t.dtype)})), 1,
        [f"expected ({HIDDEN}, {2 * HIDDEN})"], ["E-MTP-SHAPE"], extra=("--method", "mtp")),
    _doctor("mtp-quant-format", _pair("mtp", target="mtp", edit=_cfg(quantization_config={
        "quant_method": "compressed-tensors", "ignore": [],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4}}}})), 1,
        ["weight_packed", "unquantized"], ["E-MTP-QUANT-FORMAT"], extra=("--method", "mtp")),
    # -- usage
    _doctor("max-model-len-negative", _pair(), 2, ["--max-model-len", "got -5"],
            extra=("--max-model-len", "-5")),
    _doctor("max-model-len-not-a-number", _pair(), 2, ["--max-model-len", "'abc'"],
            extra=("--max-model-len", "abc")),
    _doctor("method-unknown-name", _pair(), 2, ["invalid choice: 'medusa'"],
            extra=("--method", "medusa")),
    Case("doctor/missing-draft-argument", ("doctor", "--target", "x"), 2,
         ("--draft required",)),
    Case("doctor/list-codes", ("doctor", "--list-codes"), 0,
         ("E-D2T-DUPLICATE", "E-WEIGHTS-SIZE", "W-CONTEXT-CAP")),
]


# --------------------------------------------------------------------------- #
# tokenizer-check                                                              #
# --------------------------------------------------------------------------- #

TOKCHECK = ("tokenizer-check", "{target}", "{draft}")


def _tok_pair(edit=None, base="kimi-tok"):
    def build(ws: Workspace) -> dict:
        d = ws.copy(base, "draft")
        if edit is not None:
            edit(d)
        return {"target": ws.base("kimi-tok"), "draft": d}
    return build


def _rank_lines(fn):
    """Rewrite tiktoken.model's lines with ``fn(list of lines)``."""
    def edit(d: Path) -> None:
        f = d / "tiktoken.model"
        f.write_text("\n".join(fn(f.read_text().splitlines())) + "\n")
    return edit


def _config_text(fn, file="tokenizer_config.json"):
    def edit(d: Path) -> None:
        f = d / file
        f.write_text(fn(f.read_text()))
    return edit


def _added(key: str, content: str = "<|x|>"):
    """Add an ``added_tokens_decoder`` entry with a raw key."""
    return _cfg("tokenizer_config.json",
                **{f"added_tokens_decoder.{key}": {"content": content, "special": True}})


def _tokcheck(id_, edit, code, words, extra=(), base="kimi-tok"):
    return Case(f"tokenizer-check/{id_}", TOKCHECK + tuple(extra), code, tuple(words),
                _tok_pair(edit, base))


def _dup_key_in_added(text: str) -> str:
    key = f'"{TARGET_RANKS + 3}": {{'
    i = text.index(key)
    return text[:i] + f'"{TARGET_RANKS + 3}": {{"content": "<|dup|>"}}, ' + text[i:]


TOKENIZER_CHECK_CASES: list[Case] = [
    _tokcheck("clean-identical", None, 0, ["IDENTICAL"]),
    _tokcheck("special-renamed", _added(str(TARGET_RANKS + 23), "<|think_end|>"), 1,
              ["INCOMPATIBLE"]),
    Case("tokenizer-check/target-dir-missing", TOKCHECK, 2, ("no such directory",),
         lambda ws: {"target": ws.tmp / "nope", "draft": ws.base("kimi-tok")}),
    Case("tokenizer-check/draft-is-a-file", TOKCHECK, 2, ("not a directory",),
         lambda ws: {"target": ws.base("kimi-tok"), "draft": ws.write("f.txt", "x")}),
    _tokcheck("rank-line-garbage", _rank_lines(lambda ls: ls[:16] + ["garbage"] + ls[17:]), 2,
              ["tiktoken.model line 17", "expected '<base64 token> <rank>'"]),
    _tokcheck("rank-negative", _rank_lines(lambda ls: ls[:-1] + [ls[-1].split()[0] + " -5"]), 2,
              ["is not a non-negative integer"]),
    _tokcheck("rank-duplicate-token", _rank_lines(
        lambda ls: ls + [ls[300].split()[0] + f" {len(ls)}"]), 2, ["already listed on line 301"]),
    _tokcheck("rank-duplicate-rank", _rank_lines(
        lambda ls: ls[:-1] + [ls[-1].split()[0] + " 7"]), 2, ["rank 7 already used"]),
    _tokcheck("rank-gap", _rank_lines(lambda ls: ls[:100] + ls[101:]), 2,
              ["rank 100 is missing"]),
    _tokcheck("rank-file-empty", _write("tiktoken.model", ""), 2, ["rank file has no tokens"]),
    _tokcheck("rank-file-binary", _write("tiktoken.model", bytes(range(256)) * 4), 2,
              ["tiktoken.model line 1"]),
    _tokcheck("rank-bad-base64", _rank_lines(lambda ls: ["@@@@ 0"] + ls[1:]), 2,
              ["invalid base64 token"]),
    _tokcheck("config-not-json", _write("tokenizer_config.json", "{"), 2,
              ["tokenizer_config.json line 1", "invalid JSON"]),
    _tokcheck("config-json-list", _write("tokenizer_config.json", "[]"), 2,
              ["expected a JSON object"]),
    _tokcheck("config-missing", _remove("tokenizer_config.json"), 2, ["file not found"]),
    _tokcheck("added-id-twice", _config_text(_dup_key_in_added), 2,
              [f"key '{TARGET_RANKS + 3}' appears twice"]),
    _tokcheck("added-id-negative", _added("-3"), 2, ["key '-3' is not a token id"]),
    _tokcheck("added-id-collides-with-rank", _added("5", "<|five|>"), 2,
              ["id 5 (`<|five|>`) collides with regular token 5"]),
    _tokcheck("added-id-absurd", _added(str(10**12)), 2, [f"'{10**12}' is not a token id"]),
    _tokcheck("added-entry-without-content", _cfg("tokenizer_config.json", **{
        f"added_tokens_decoder.{TARGET_RANKS + 40}": {"special": True}}), 2,
        ["has no 'content' string"]),
    _tokcheck("chat-template-number", _cfg("tokenizer_config.json", chat_template=7), 2,
              ["chat_template must be a string or a list, got int"]),
    _tokcheck("config-vocab-size-string", _write("config.json", '{"vocab_size": "big"}'), 2,
              ["vocab_size must be a positive integer, got 'big'"]),
    _tokcheck("json-output-on-bad-input", _write("tiktoken.model", ""), 2,
              ['"verdict": "error"', "no tokens"], extra=("--json",)),
]


# --------------------------------------------------------------------------- #
# draft tli-check                                                              #
# --------------------------------------------------------------------------- #

TLI = ("draft", "tli-check", "--target", "{target}", "--draft", "{draft}")


def _hf_json(mutate):
    """Rewrite the draft's tokenizer.json with ``mutate(data) -> data or str``."""
    def edit(d: Path) -> None:
        f = d / "tokenizer.json"
        out = mutate(json.loads(f.read_text()))
        f.write_text(out if isinstance(out, str) else json.dumps(out))
    return edit


def _vocab(fn):
    def mutate(data):
        fn(data["model"]["vocab"])
        return data
    return _hf_json(mutate)


def _listed_twice(data) -> str:
    text = json.dumps(data)
    return text.replace('"vocab": {', '"vocab": {"zzqx#": 0, ', 1)


def _tli(id_, edit, code, words, extra=(), base="hf-tok"):
    return Case(f"tli-check/{id_}", TLI + tuple(extra), code, tuple(words),
                _tok_pair(edit, base))


def _sentencepiece_collision(d: Path) -> None:
    (d / "tokenizer.json").write_text(json.dumps(
        {"model": {"type": "BPE", "vocab": {"\u2581a": 0, " a": 1, "b": 2}}}))


TLI_CHECK_CASES: list[Case] = [
    _tli("clean-kimi-vs-hf", None, 0, ["shared tokens", "<think>"]),
    _tli("below-min-shared-fraction", None, 1, ["below --min-shared-fraction"],
         extra=("--min-shared-fraction", "0.99")),
    _tli("fraction-nan", None, 2, ["--min-shared-fraction", "finite", "'nan'"],
         extra=("--min-shared-fraction", "nan")),
    _tli("fraction-inf", None, 2, ["finite", "'inf'"], extra=("--min-shared-fraction", "inf")),
    _tli("fraction-above-one", None, 2, ["in [0.0, 1.0]", "got 1.5"],
         extra=("--min-shared-fraction", "1.5")),
    _tli("fraction-negative", None, 2, ["in [0.0, 1.0]"], extra=("--min-shared-fraction", "-0.1")),
    _tli("fraction-not-a-number", None, 2, ["'abc'"], extra=("--min-shared-fraction", "abc")),
    _tli("target-vocab-zero", None, 2, ["--target-vocab-size", "got 0"],
         extra=("--target-vocab-size", "0")),
    _tli("target-vocab-absurd", None, 2, ["--target-vocab-size", str(10**12)],
         extra=("--target-vocab-size", str(10**12))),
    _tli("target-vocab-more-than-twice", None, 2, ["more than twice", "--target-vocab-size"],
         extra=("--target-vocab-size", "4000000")),
    _tli("target-vocab-below-tokenizer", None, 2, ["does not belong to this model"],
         extra=("--target-vocab-size", "100")),
    _tli("draft-vocab-negative", None, 2, ["--draft-vocab-size", "got -1"],
         extra=("--draft-vocab-size", "-1")),
    _tli("hf-negative-id", _vocab(lambda v: v.update({"zzqx#": -4})), 2,
         ["model.vocab['zzqx#'] = -4 is not a token id"]),
    _tli("hf-duplicate-id", _vocab(lambda v: v.update({"zzqx#": 3})), 2,
         ["gives id 3 to both", "duplicate id"]),
    _tli("hf-token-listed-twice", _hf_json(_listed_twice), 2, ["'zzqx#' appears twice"]),
    _tli("hf-added-collides-with-vocab", _hf_json(lambda data: {
        **data, "added_tokens": [{"id": 3, "content": "<|eot|>"}]}), 2,
        ["id 3 is '<|eot|>' in added_tokens but", "colliding ids"]),
    _tli("hf-added-ids-collide", _hf_json(lambda data: {
        **data, "added_tokens": [{"id": 900, "content": "<a>"}, {"id": 900, "content": "<b>"}]}),
        2, ["id 900 is '<b>' in added_tokens but '<a>'"]),
    _tli("hf-absurd-id", _vocab(lambda v: v.update({"zzqx#": 10**9})), 2, ["is not a token id"]),
    _tli("hf-not-json", _write("tokenizer.json", "{"), 2, ["invalid JSON"]),
    _tli("hf-top-level-list", _write("tokenizer.json", "[]"), 2, ["expected a JSON object"]),
    _tli("hf-model-string", _hf_json(lambda data: {**data, "model": "BPE"}), 2,
         ["model type 'BPE' is not supported"]),
    _tli("hf-added-without-id", _hf_json(lambda data: {
        **data, "added_tokens": [{"content": "<a>"}]}), 2, ["added_tokens[0]", "'id'"]),
    _tli("hf-two-spellings-one-token", _sentencepiece_collision, 2,
         ["token b' a' has ids 0 and 1", "colliding ids"]),
    _tli("draft-without-tokenizer", lambda d: [p.unlink() for p in d.iterdir()], 2,
         ["no tokenizer found"]),
    _tli("kimi-draft-bad-rank-line", _rank_lines(lambda ls: ["x"] + ls[1:]), 2,
         ["tiktoken.model line 1"], base="kimi-tok"),
]


# --------------------------------------------------------------------------- #
# draft shrink-vocab                                                           #
# --------------------------------------------------------------------------- #

SHRINK = ("draft", "shrink-vocab", "--head", "{head}", "--tokenizer", "{tok}",
          "--trust-remote-code", "--corpus", "{corpus}", "--out", "{out}", "--size", "400")
_RECORDS = [{"prompt": "What is the capital of France? One word."},
            {"text": "def add(x, y):\n    return x + y\n"},
            {"turns": ["Summarise Hamlet.", "Shorter."]}]


def _jsonl(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _shrink_inputs(corpus=None, head_edit=None, out=None):
    """Build: an (edited) copy of the head, the shared tokenizer, a corpus (``corpus``:
    text/bytes, or a function of the workspace returning a path) and an output path."""

    def build(ws: Workspace) -> dict:
        head = ws.copy("eagle3", "head")
        if head_edit is not None:
            head_edit(head)
        if callable(corpus):
            c = corpus(ws)
        else:
            c = ws.write("corpus.jsonl", _jsonl(_RECORDS) if corpus is None else corpus)
        o = out(ws, head) if out is not None else ws.tmp / "out"
        return {"head": head, "tok": ws.base("kimi-tok"), "corpus": c, "out": o}

    return build


def _shrink(id_, build, code, words, extra=(), argv=SHRINK, out_given=False):
    """A shrink-vocab case; a refused run must leave no output (unless the case hands
    it an existing ``--out``, which must survive)."""
    absent = ("out",) if code != 0 and not out_given else ()
    return Case(f"shrink-vocab/{id_}", tuple(argv) + tuple(extra), code, tuple(words), build,
                absent=absent)


def _corpus_file(name: str, content):
    return lambda ws: ws.write(name, content)


def _gz(name: str, text: str, cut: int | None = None):
    def make(ws: Workspace) -> Path:
        data = gzip.compress(text.encode())
        return ws.write(name, data if cut is None else data[:cut])
    return make


def _sharegpt_array(ws: Workspace) -> Path:
    return ws.write("sharegpt.json", json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "Hi there, how are you?"},
                                      {"from": "gpt", "value": "Fine, thanks."}]},
        {"id": "b", "conversations": [{"from": "human", "value": "Name a prime number."}]}]))


def _messages_jsonl(ws: Workspace) -> Path:
    return ws.write("chat.jsonl", _jsonl([
        {"messages": [{"role": "user", "content": "Translate 'cat' to French."},
                      {"role": "assistant", "content": [{"type": "text", "text": "chat"}]}]}]))


def _file_at(path_in_ws: str):
    return lambda ws, head: ws.write(path_in_ws, "i am a file") / "x" / "out"


def _argv_without(flag: str) -> tuple[str, ...]:
    return tuple(a for a in SHRINK if a != flag)


SHRINK_VOCAB_CASES: list[Case] = [
    _shrink("clean", _shrink_inputs(), 0, ["kept 400 of 768 tokens"]),
    _shrink("sharegpt-jsonl", _shrink_inputs(corpus=_jsonl([
        {"conversations": [{"from": "human", "value": "What is 2+2?"},
                           {"from": "gpt", "value": "4"}]}])), 0, ["coverage overall"]),
    _shrink("sharegpt-json-array", _shrink_inputs(corpus=_sharegpt_array), 0,
            ["sharegpt.json", "2 records"]),
    _shrink("openai-messages-with-parts", _shrink_inputs(corpus=_messages_jsonl), 0,
            ["chat.jsonl", "1 records"]),
    _shrink("field-per-file", _shrink_inputs(corpus=_jsonl([{"body": "hello world"}])), 0,
            ["corpus.jsonl"], extra=("--field", "{corpus}:body")),
    _shrink("field-names-unknown-file", _shrink_inputs(), 2,
            ["--field other.jsonl:body", "is not one of the --corpus files"],
            extra=("--field", "other.jsonl:body")),
    _shrink("field-twice-for-all", _shrink_inputs(), 2, ["--field given twice"],
            extra=("--field", "a", "--field", "b")),
    _shrink("field-empty", _shrink_inputs(), 2, ["empty field"], extra=("--field", "{corpus}:")),
    _shrink("size-zero", _shrink_inputs(), 2, ["--size", "got 0"], extra=("--size", "0")),
    _shrink("size-not-a-number", _shrink_inputs(), 2, ["--size", "'many'"],
            extra=("--size", "many")),
    _shrink("size-not-below-vocab", _shrink_inputs(), 2, ["smaller than the head's vocab_size"],
            extra=("--size", str(VOCAB))),
    _shrink("text-unit-unknown", _shrink_inputs(), 2, ["invalid choice: 'page'"],
            extra=("--text-unit", "page")),
    _shrink("out-under-a-file", _shrink_inputs(out=_file_at("blocker")), 2,
            ["is a file, not a directory"]),
    _shrink("out-inside-head", _shrink_inputs(out=lambda ws, head: head / "small"), 2,
            ["is inside the head directory"]),
    _shrink("out-contains-head", _shrink_inputs(out=lambda ws, head: ws.tmp), 2,
            ["contains the head directory"], extra=("--force",), out_given=True),
    _shrink("out-is-head", _shrink_inputs(out=lambda ws, head: head), 2,
            ["is the input head"], extra=("--force",), out_given=True),
    _shrink("out-exists", _shrink_inputs(out=lambda ws, head: ws.write("out/keep", "x").parent),
            2, ["exists (use --force"], out_given=True),
    _shrink("out-is-a-file-with-force", _shrink_inputs(out=lambda ws, head: ws.write(
        "outfile", "x")), 2, ["exists and is not a directory"], extra=("--force",), out_given=True),
    _shrink("corpus-missing", _shrink_inputs(corpus=lambda ws: ws.tmp / "nope.jsonl"), 2,
            ["nope.jsonl does not exist"]),
    _shrink("corpus-binary", _shrink_inputs(corpus=_corpus_file("c.bin", b"\x7fELF\0\0\1" * 50)),
            2, ["binary file (NUL byte at offset 4)"]),
    _shrink("corpus-latin1", _shrink_inputs(corpus=_corpus_file(
        "c.txt", "caf\u00e9 cr\u00e8me\n".encode("latin-1"))), 2, ["not UTF-8 text"]),
    _shrink("corpus-gz-not-gzip", _shrink_inputs(corpus=_corpus_file("c.jsonl.gz", "plain")), 2,
            ["not a valid gzip file"]),
    _shrink("corpus-gz-truncated", _shrink_inputs(corpus=_gz(
        "c.txt.gz", "a line of text\n" * 2000, cut=40)), 2, ["gzip"]),
    _shrink("corpus-jsonl-bad-line", _shrink_inputs(corpus='{"prompt": "ok"}\n{"prompt": \n'), 2,
            ["line 2 is not valid JSON"]),
    _shrink("corpus-json-array-broken", _shrink_inputs(corpus=_corpus_file(
        "c.json", '[{"prompt": "a"},')), 2, ["not a valid JSON array"]),
    _shrink("corpus-empty", _shrink_inputs(corpus=_corpus_file("c.txt", "\n\n")), 2,
            ["empty corpus", "has no records"]),
    _shrink("corpus-without-known-fields", _shrink_inputs(corpus=_jsonl([{"x": "y"}])), 2,
            ["no usable records", "conversations, messages"]),
    _shrink("head-missing", lambda ws: {**_shrink_inputs()(ws), "head": ws.tmp / "nohead"}, 2,
            ["is not a directory"]),
    _shrink("head-truncated", _shrink_inputs(head_edit=_truncate(0.6)), 2,
            ["truncated", "model.safetensors"]),
    _shrink("head-config-not-json", _shrink_inputs(head_edit=_write("config.json", "{")), 2,
            ["cannot read config.json"]),
    _shrink("head-config-list", _shrink_inputs(head_edit=_write("config.json", "[]")), 2,
            ["holds a JSON list"]),
    _shrink("head-architectures-string", _shrink_inputs(head_edit=_cfg(
        architectures="LlamaForCausalLMEagle3")), 2, ["architectures must be a list"]),
    _shrink("head-not-eagle3", _shrink_inputs(head_edit=_tensors(drop=["fc.weight"])), 2,
            ["no fc.weight tensor"]),
    _shrink("head-already-reduced", lambda ws: {**_shrink_inputs()(ws),
                                                "head": ws.copy("eagle3-reduced", "rhead")}, 2,
            ["already reduced"]),
    _shrink("auto-map-without-trust-remote-code", _shrink_inputs(), 2,
            ["ships its own code", "--trust-remote-code"],
            argv=_argv_without("--trust-remote-code")),
    _shrink("tokenizer-missing", lambda ws: {**_shrink_inputs()(ws), "tok": ws.tmp / "notok"}, 2,
            ["cannot load tokenizer"]),
    _shrink("head-vocab-size-vs-lm-head", _shrink_inputs(head_edit=_cfg(
        vocab_size=VOCAB + 64, draft_vocab_size=DROP)),
            2, [f"lm_head.weight has {VOCAB} rows", f"vocab_size is {VOCAB + 64}"]),
]


# --------------------------------------------------------------------------- #
# the command-line wrapper                                                     #
# --------------------------------------------------------------------------- #


def _raising(exc: BaseException):
    """Build: make the doctor raise ``exc`` (a stand-in for any unforeseen failure)."""

    def build(ws: Workspace) -> dict:
        def boom(*args, **kwargs):
            raise exc

        ws.monkeypatch.setattr("vllm_kimi_ext.drafts.doctor.diagnosis.diagnose", boom)
        return {"target": ws.base("target"), "draft": ws.base("eagle3")}

    return build


CLI_CASES: list[Case] = [
    Case("cli/no-arguments", (), 2, ("COMMAND", "exit codes")),
    Case("cli/unknown-command", ("frobnicate",), 2, ("invalid choice: 'frobnicate'",)),
    Case("cli/unknown-option", ("doctor", "--bogus"), 2, ("unrecognized arguments: --bogus",)),
    Case("cli/help-names-exit-codes", ("--help",), 0, ("exit codes: 0 clean", "1 findings",
                                                       "2 usage error")),
    Case("cli/subcommand-help-names-exit-codes", ("doctor", "--help"), 0,
         ("exit codes: 0 clean", "--debug", "--list-codes")),
    Case("cli/nested-help-names-exit-codes", ("draft", "shrink-vocab", "--help"), 0,
         ("exit codes: 0 clean", "FILE:FIELD")),
    Case("cli/tli-check-help", ("draft", "tli-check", "--help"), 0, ("exit codes",)),
    Case("cli/draft-group-alone", ("draft",), 2, ("shrink-vocab", "tli-check")),
    Case("cli/internal-error-is-one-line", DOCTOR, 2,
         ("internal error: RuntimeError: boom", "--debug"), _raising(RuntimeError("boom"))),
    Case("cli/internal-error-with-debug-shows-traceback", ("--debug",) + DOCTOR, 2,
         ("Traceback", "RuntimeError: boom"), _raising(RuntimeError("boom"))),
    Case("cli/debug-after-subcommand", DOCTOR + ("--debug",), 2, ("Traceback", "KeyError"),
         _raising(KeyError("x"))),
    Case("cli/os-error-names-the-file", DOCTOR, 2,
         ("cannot access /models/x/config.json: Permission denied",),
         _raising(PermissionError(13, "Permission denied", "/models/x/config.json"))),
    Case("cli/interrupted", DOCTOR, 130, ("interrupted",), _raising(KeyboardInterrupt())),
    Case("cli/list-codes-json", ("doctor", "--list-codes", "--json"), 0,
         ('"code": "E-T2D-MISMATCH"', '"severity": "warning"')),
    # an empty value is never a path (read as one it is the current folder: `--out ""` said
    # ". exists", `--corpus ""` ". does not exist", `--verify-report ""` ". no such report")
    *[Case(f"cli/empty-{name}", argv, 2, (f"argument {flag}: empty path or value",))
      for name, flag, argv in (
          ("out", "--out", ("draft", "shrink-vocab", "--head", "h", "--tokenizer", "t",
                            "--corpus", "c", "--out", "")),
          ("corpus", "--corpus", ("draft", "shrink-vocab", "--head", "h", "--tokenizer", "t",
                                  "--corpus", "", "--out", "o")),
          ("out-equals", "--out", ("draft", "shrink-vocab", "--head", "h", "--tokenizer", "t",
                                   "--corpus", "c", "--out=")),
          ("verify-report", "--verify-report", ("plan", "--verify-cost", "--verify-report",
                                                "")),
          ("train-data", "--data", ("draft", "train", "--data", "", "--target", "t",
                                    "--out", "o")),
          ("positional", "2 of the command line", ("tokenizer-check", "", "x")))],
]

# Hooks for tools whose argument validation lives elsewhere: append Case(...) entries
# (ids "plan/..." / "bench-runner/..."); a runner with its own main passes entry=.
def _plan_files(ws: Workspace) -> dict[str, Path]:
    return {"bad": ws.write("bad.json", "{not json"),
            "partial": ws.write("partial.json", '{"name": "x"}'),
            "file": ws.write("a-file", "i am a file"),
            "nosuch": ws.tmp / "nosuch.json",
            "png": ws.tmp / "out" / "plan.png"}


def _plan(what: str, args: tuple[str, ...], code: int, words: tuple[str, ...],
          absent: tuple[str, ...] = ()) -> Case:
    return Case(f"plan/{what}", ("plan", *args), code, words, _plan_files, absent=absent)


PLAN_CASES: list[Case] = [
    _plan("tau-k-zero-not-replaced", ("--tau", "2.5", "--tau-k", "0"), 2,
          ("--tau-k must be within 1..15", "'0'")),
    _plan("tau-nan", ("--tau", "nan"), 2, ("--tau must be finite", "'nan'")),
    _plan("tau-inf", ("--tau", "inf"), 2, ("--tau must be finite",)),
    _plan("tau-below-one", ("--tau", "-1"), 2, ("--tau must be >= 1",)),
    _plan("batch-zero", ("--batch", "0"), 2, ("--batch must be within 1..4096",)),
    _plan("batch-not-integer", ("--batch", "abc"), 2, ("--batch must be an integer", "'abc'")),
    _plan("context-negative", ("--context", "-5"), 2, ("--context must be within 0..",)),
    _plan("routing-skew-inf", ("--routing-skew", "inf"), 2, ("--routing-skew must be finite",)),
    _plan("k-max-zero", ("--k-max", "0"), 2, ("--k-max must be within 1..7",)),
    _plan("acceptance-increasing", ("--acceptance", "0.5,0.7"), 2,
          ("per-position rates must not increase",)),
    _plan("acceptance-above-one", ("--acceptance", "1.5"), 2, ("within [0, 1]", "'1.5'")),
    _plan("tau-and-acceptance", ("--tau", "2.5", "--acceptance", "0.5"), 2,
          ("not allowed with argument --tau",)),
    _plan("out-suffix-unknown", ("--out", "{file}.txt"), 2,
          ("the suffix must be one of .png, .svg, .pdf",)),
    _plan("out-under-a-file", ("--out", "{file}/x.png"), 2, ("is a file, not a directory",)),
    _plan("json-under-a-file", ("--json", "{file}/x.json"), 2, ("is a file, not a directory",)),
    _plan("hardware-not-json", ("--hardware", "{bad}", "--out", "{png}"), 2,
          ("bad.json: not valid JSON", "line 1"), absent=("png",)),
    _plan("hardware-missing-field", ("--hardware", "{partial}"), 2,
          ("partial.json: field 'tp' is missing",)),
    _plan("hardware-unknown-name", ("--hardware", "nosuch"), 2,
          ("unknown hardware profile 'nosuch'", "valid: rtx-pro-6000-pcie-x8")),
    _plan("draft-unknown-name", ("--draft", "nosuch"), 2,
          ("unknown draft profile 'nosuch'", "lightseek-eagle3")),
    _plan("model-not-json", ("--model", "{bad}"), 2, ("bad.json: not valid JSON",)),
    _plan("latency-missing-backends", ("--latency", "{partial}"), 2,
          ("partial.json: field 'backends'",)),
    _plan("acceptance-from-missing-file", ("--acceptance-from", "{nosuch}"), 2,
          ("nosuch.json: cannot read",)),
    _plan("acceptance-from-not-json", ("--acceptance-from", "{bad}"), 2,
          ("bad.json: not valid JSON",)),
    _plan("backend-not-costed", ("--backend", "bogus"), 2,
          ("--backend 'bogus': not costed", "valid: nccl")),
]
BENCH_RUNNER_CASES: list[Case] = []

CASES_BY_TOOL: dict[str, list[Case]] = {
    "cli": CLI_CASES,
    "doctor": DOCTOR_CASES,
    "tokenizer-check": TOKENIZER_CHECK_CASES,
    "tli-check": TLI_CHECK_CASES,
    "shrink-vocab": SHRINK_VOCAB_CASES,
    "plan": PLAN_CASES,
    "bench-runner": BENCH_RUNNER_CASES,
}
ALL_CASES: list[Case] = [c for cases in CASES_BY_TOOL.values() for c in cases]

"""tokenizer-check: every verdict path, reason texts, CLI exit codes, bad input."""

from __future__ import annotations

import base64
import json
import shutil

import pytest

from testkit.tokenizers import (
    KIMI_CHAT_TEMPLATE,
    REAL_KIMI_N_RANKS,
    build_ranks,
    kimi_special_tokens,
    reserved_token_name,
    write_kimi_tokenizer,
    write_variant,
)
from vllm_kimi_ext.cli import main
from vllm_kimi_ext.tokenizers import (
    TokenizerInputError,
    TokenizerMismatchError,
    check_tokenizers,
    load_tokenizer_dir,
    refuse_if_incompatible,
)
from vllm_kimi_ext.tokenizers.compare import template_tokens

N = 1024  # ranks of the small test tokenizers


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    out = {"target": write_kimi_tokenizer(root / "target", n_ranks=N)}
    for v in ("identical", "special_rename", "special_move", "shifted_ranks", "different_size"):
        out[v] = write_variant(root / v, v, n_ranks=N)
    return out


def _inc(report):
    return [f for f in report.findings if f.severity == "incompatible"]


# ------------------------------------------------------------------------ generator


def test_generator_is_deterministic_and_kimi_shaped(tmp_path, dirs):
    again = write_kimi_tokenizer(tmp_path / "again", n_ranks=N)
    for name in ("tiktoken.model", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (dirs["target"] / name).read_bytes()
    lines = (dirs["target"] / "tiktoken.model").read_text().splitlines()
    assert len(lines) == N
    tok, rank = lines[300].split(" ")
    assert rank == "300" and base64.b64decode(tok) == build_ranks(N)[300]
    assert [base64.b64decode(ln.split()[0]) for ln in lines[:256]] == [
        bytes([i]) for i in range(256)
    ]
    cfg = json.loads((dirs["target"] / "tokenizer_config.json").read_text())
    assert len(cfg["added_tokens_decoder"]) == 256
    assert cfg["added_tokens_decoder"][str(N)]["content"] == "[BOS]"
    assert cfg["added_tokens_decoder"][str(N + 5)]["content"] == reserved_token_name(N + 5)
    assert cfg["added_tokens_decoder"][str(N + 22)]["special"] is False  # <think>
    assert cfg["auto_map"]["AutoTokenizer"][0] == "tokenization_kimi.TikTokenTokenizer"
    assert (dirs["target"] / "tokenization_kimi.py").is_file()
    # every merged token is the concatenation of two lower-ranked tokens (a real BPE)
    ranks = build_ranks(N)
    index = {t: i for i, t in enumerate(ranks)}
    for i, t in enumerate(ranks[256:], start=256):
        assert any(index.get(t[:k], i) < i and index.get(t[k:], i) < i for k in range(1, len(t))), t


def test_real_layout_ids():
    sp = kimi_special_tokens(REAL_KIMI_N_RANKS)
    assert len(sp) == 256 and min(sp) == 163584 and max(sp) == 163839
    assert sp[163584] == "[BOS]" and sp[163585] == "[EOS]" and sp[163586] == "<|im_end|>"
    assert sp[163595] == "<|tool_calls_section_begin|>" and sp[163599] == "<|tool_call_end|>"
    assert sp[163605] == "<|media_pad|>"
    assert sp[163606] == "<think>" and sp[163607] == "</think>"
    assert sp[163700] == "<|reserved_token_163700|>"


def test_real_size_tokenizer_dir(tmp_path):
    t = write_kimi_tokenizer(tmp_path / "t", n_ranks=REAL_KIMI_N_RANKS)
    files = load_tokenizer_dir(t)
    assert files.n_ranks == 163584 and files.vocab_size == 163840
    assert files.token_id("<think>") == 163606 and files.token_id("</think>") == 163607
    assert files.token_id("[EOS]") == 163585
    assert files.named_special()[163595] == "<|tool_calls_section_begin|>"


# ------------------------------------------------------------------------- verdicts


def test_identical(dirs):
    r = check_tokenizers(dirs["target"], dirs["identical"])
    assert r.verdict == "identical" and r.ok
    assert any("rank files identical" in m for m in r.reasons)
    assert any("special tokens identical (256 ids, 23 named)" in m for m in r.reasons)
    assert any("chat templates identical" in m for m in r.reasons)
    assert r.first_rank_mismatch is None
    assert refuse_if_incompatible(dirs["target"], dirs["identical"]).verdict == "identical"


def test_special_rename_is_incompatible(dirs):
    r = check_tokenizers(dirs["target"], dirs["special_rename"])
    assert r.verdict == "incompatible"
    assert r.codes("incompatible") == ["special_renamed"]
    (msg,) = r.reasons
    assert msg.startswith("`</think>` (used by the target's chat template)")
    assert f"target id {N + 23} is not a special token of the draft" in msg
    assert f"draft id {N + 23} is `<|think_end|>`" in msg


def test_special_move_is_incompatible(dirs):
    r = check_tokenizers(dirs["target"], dirs["special_move"])
    assert r.verdict == "incompatible"
    assert r.codes("incompatible") == ["special_moved"]
    (msg,) = r.reasons
    assert f"target id {N + 23} is draft id {N + 24}" in msg
    assert f"draft id {N + 23} is `{reserved_token_name(N + 23)}`" in msg
    # the draft naming a slot the target keeps reserved is reported, but harmless
    extra = [f for f in r.findings if f.code == "draft_extra_special"]
    assert extra and extra[0].severity == "compatible"
    assert f"id {N + 24}: draft `</think>`" in extra[0].message


def test_shifted_ranks_is_incompatible(dirs):
    r = check_tokenizers(dirs["target"], dirs["shifted_ranks"])
    assert r.verdict == "incompatible"
    assert r.codes("incompatible") == ["rank_mismatch"]
    ranks = build_ranks(N)
    m = r.first_rank_mismatch
    assert m["rank"] == 300 and m["differing_ranks"] == 2
    assert m["target"] == repr(ranks[300]) and m["draft"] == repr(ranks[301])
    assert base64.b64decode(m["draft_base64"]) == ranks[301]
    (msg,) = r.reasons
    assert f"first differing rank 300: target {ranks[300]!r}, draft {ranks[301]!r}" in msg
    assert f"(2 of {N} shared ranks differ)" in msg


def test_bigger_draft_moves_every_special(dirs):
    r = check_tokenizers(dirs["target"], dirs["different_size"])
    assert r.verdict == "incompatible"
    assert set(r.codes("incompatible")) == {"special_moved"}
    assert len(r.reasons) == 23  # every named special token of the target
    assert any(
        m.startswith("`[BOS]` (target bos_token")
        and f"target id {N} is draft id {N + 512}; draft id {N} is regular token" in m
        for m in r.reasons
    )
    assert "draft_more_ranks" in r.codes("compatible")
    assert "tokenizer_vocab_size_differs" in r.codes("compatible")


def test_smaller_draft(dirs):
    r = check_tokenizers(dirs["different_size"], dirs["target"])
    assert r.verdict == "incompatible"
    assert "draft_fewer_ranks" in r.codes("incompatible")
    assert any(
        f"draft rank file has {N} ranks, target {N + 512}: target ids {N}..{N + 511}" in m
        for m in r.reasons
    )


def test_target_only_special_is_incompatible(tmp_path, dirs):
    t = write_kimi_tokenizer(tmp_path / "t", n_ranks=N, rename_special={N + 100: "<|extra|>"})
    r = check_tokenizers(t, dirs["target"])
    assert r.verdict == "incompatible"
    (msg,) = r.reasons
    assert msg.startswith(f"`<|extra|>`: target id {N + 100} is not a special token of the draft")
    assert f"draft id {N + 100} is `{reserved_token_name(N + 100)}`" in msg


def test_duplicated_special_in_draft_is_incompatible(tmp_path, dirs):
    d = write_kimi_tokenizer(tmp_path / "d", n_ranks=N, rename_special={N + 30: "</think>"})
    r = check_tokenizers(dirs["target"], d)
    assert r.verdict == "incompatible"
    assert r.codes("incompatible") == ["special_duplicated"]
    assert f"target id {N + 23} is also draft id(s) {N + 30}" in r.reasons[0]


def test_draft_names_a_reserved_slot_is_compatible(tmp_path, dirs):
    d = write_kimi_tokenizer(tmp_path / "d", n_ranks=N, rename_special={N + 100: "<|draft_only|>"})
    r = check_tokenizers(dirs["target"], d)
    assert r.verdict == "compatible" and r.ok
    (msg,) = r.reasons
    assert msg.startswith("draft names 1 id(s) the target keeps reserved or lacks")
    assert f"id {N + 100}: draft `<|draft_only|>`, target `{reserved_token_name(N + 100)}`" in msg
    assert refuse_if_incompatible(dirs["target"], d).verdict == "compatible"


def test_draft_eos_field_and_template_are_compatible(tmp_path, dirs):
    d = write_kimi_tokenizer(
        tmp_path / "d", n_ranks=N, eos_token="<|im_end|>", chat_template="{{ messages }}"
    )
    r = check_tokenizers(dirs["target"], d)
    assert r.verdict == "compatible"
    assert set(r.codes("compatible")) == {"eos_token_differs", "chat_template_differs"}
    assert any(
        m.startswith(f"eos_token: target `[EOS]` (id {N + 1}), draft `<|im_end|>` (id {N + 2})")
        for m in r.reasons
    )
    assert "chat templates differ (vLLM renders prompts with the target's)" in r.reasons


def test_same_ranks_different_bytes_is_compatible(tmp_path, dirs):
    d = tmp_path / "d"
    shutil.copytree(dirs["target"], d)
    lines = (d / "tiktoken.model").read_text().splitlines()
    (d / "tiktoken.model").write_text("\n".join(reversed(lines)) + "\n\n")
    r = check_tokenizers(dirs["target"], d)
    assert r.verdict == "compatible"
    assert r.codes("compatible") == ["rank_file_bytes_differ"]
    assert f"define the same {N} ranks" in r.reasons[0]


def test_config_vocab_size_mismatch_is_incompatible(tmp_path):
    t = write_kimi_tokenizer(tmp_path / "t", n_ranks=N, config_vocab_size=N + 256)
    d = write_kimi_tokenizer(tmp_path / "d", n_ranks=N, config_vocab_size=N + 512)
    r = check_tokenizers(t, d)
    assert r.verdict == "incompatible"
    assert r.reasons == [
        (
            f"config.json vocab_size: target {N + 256}, draft {N + 512} (vLLM's draft_model "
            "method requires equal vocab sizes)"
        )
    ]
    assert r.target["config_vocab_size"] == N + 256


def test_template_tokens():
    toks = template_tokens(KIMI_CHAT_TEMPLATE)
    for t in (
        "<|im_user|>",
        "<|im_middle|>",
        "<|im_end|>",
        "<think>",
        "</think>",
        "<|tool_calls_section_begin|>",
        "<|tool_call_argument_begin|>",
        "<|media_pad|>",
    ):
        assert t in toks
    assert toks.index("<|im_system|>") < toks.index("<|im_user|>")  # first-use order
    assert template_tokens("<s>{{ x }}", ["<s>"]) == ["<s>"]
    assert template_tokens(None) == []


def test_template_token_not_special_in_target_is_noted(tmp_path, dirs):
    t = write_kimi_tokenizer(tmp_path / "t", n_ranks=N, chat_template="<|im_user|><|mystery|>")
    r = check_tokenizers(t, dirs["target"])
    notes = [f for f in r.findings if f.code == "template_plain_text"]
    assert notes and notes[0].severity == "info" and "`<|mystery|>`" in notes[0].message
    assert r.template_tokens == ["<|im_user|>", "<|mystery|>"]


def test_mismatch_error_lists_all_reasons(dirs):
    with pytest.raises(TokenizerMismatchError) as ei:
        refuse_if_incompatible(dirs["target"], dirs["different_size"])
    err = ei.value
    assert isinstance(err, ValueError)
    assert err.report.verdict == "incompatible" and len(err.reasons) == 23
    text = str(err)
    assert "(23 reason(s))" in text
    assert all(reason in text for reason in err.reasons)


def test_chat_template_sources(tmp_path, dirs):
    d = tmp_path / "d"
    shutil.copytree(dirs["target"], d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    tmpl = cfg.pop("chat_template")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "chat_template.jinja").write_text(tmpl)
    assert load_tokenizer_dir(d).chat_template == tmpl
    cfg["chat_template"] = [
        {"name": "tool_use", "template": "x"},
        {"name": "default", "template": tmpl},
    ]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert load_tokenizer_dir(d).chat_template == tmpl


def test_tokenizer_model_name_is_accepted(tmp_path, dirs):
    d = tmp_path / "d"
    shutil.copytree(dirs["target"], d)
    (d / "tiktoken.model").rename(d / "tokenizer.model")
    assert check_tokenizers(dirs["target"], d).verdict == "identical"


# ------------------------------------------------------------------------ bad input


def _corrupt(tmp_path, dirs, lineno, text):
    d = tmp_path / "bad"
    shutil.copytree(dirs["target"], d)
    lines = (d / "tiktoken.model").read_text().splitlines()
    lines[lineno - 1] = text
    (d / "tiktoken.model").write_text("\n".join(lines) + "\n")
    return d


@pytest.mark.parametrize(
    "lineno, text, expected",
    [
        (17, "not-a-valid-line", "line 17: expected '<base64 token> <rank>'"),
        (5, "@@@@ 4", "line 5: invalid base64 token '@@@@'"),
        (9, "YQ== eight", "line 9: rank 'eight' is not a non-negative integer"),
        (400, "IA== 399", "line 400: token b' ' already listed on line 33"),
        (
            400,
            f"{base64.b64encode(b'zzzz-new').decode()} 12",
            "line 400: rank 12 already used on line 13",
        ),
    ],
)
def test_corrupt_rank_file(tmp_path, dirs, lineno, text, expected):
    d = _corrupt(tmp_path, dirs, lineno, text)
    with pytest.raises(TokenizerInputError) as ei:
        check_tokenizers(dirs["target"], d)
    msg = str(ei.value)
    assert "tiktoken.model" in msg and expected in msg
    assert ei.value.line == lineno and ei.value.path.endswith("tiktoken.model")


def test_rank_gap(tmp_path, dirs):
    d = _corrupt(tmp_path, dirs, 600, f"{base64.b64encode(b'zzzz-new').decode()} 5000")
    with pytest.raises(TokenizerInputError, match="rank 599 is missing"):
        load_tokenizer_dir(d)


def test_missing_files(tmp_path, dirs):
    with pytest.raises(TokenizerInputError, match="no such directory"):
        load_tokenizer_dir(tmp_path / "nope")
    d = tmp_path / "d"
    shutil.copytree(dirs["target"], d)
    (d / "tokenizer_config.json").unlink()
    with pytest.raises(TokenizerInputError, match=r"tokenizer_config\.json: file not found"):
        load_tokenizer_dir(d)
    (d / "tiktoken.model").unlink()
    with pytest.raises(TokenizerInputError, match="no tiktoken rank file"):
        load_tokenizer_dir(d)


def test_bad_json(tmp_path, dirs):
    d = tmp_path / "d"
    shutil.copytree(dirs["target"], d)
    (d / "tokenizer_config.json").write_text('{\n  "bos_token": "[BOS]",\n  oops\n}\n')
    with pytest.raises(TokenizerInputError, match=r"tokenizer_config\.json line 3 column 3"):
        load_tokenizer_dir(d)
    (d / "tokenizer_config.json").write_text('{"added_tokens_decoder": {"x1": {"content": "a"}}}')
    with pytest.raises(
        TokenizerInputError, match="added_tokens_decoder key 'x1' is not a token id"
    ):
        load_tokenizer_dir(d)
    (d / "tokenizer_config.json").write_text(
        '{"added_tokens_decoder": {"1030": {"special": true}}}'
    )
    with pytest.raises(
        TokenizerInputError, match=r"added_tokens_decoder\['1030'\] has no 'content'"
    ):
        load_tokenizer_dir(d)


# ------------------------------------------------------------------------------ CLI


@pytest.mark.parametrize(
    "variant, code, word",
    [
        ("identical", 0, "IDENTICAL"),
        ("special_rename", 1, "INCOMPATIBLE"),
        ("special_move", 1, "INCOMPATIBLE"),
        ("shifted_ranks", 1, "INCOMPATIBLE"),
        ("different_size", 1, "INCOMPATIBLE"),
    ],
)
def test_cli_exit_codes(dirs, capsys, variant, code, word):
    assert main(["tokenizer-check", str(dirs["target"]), str(dirs[variant])]) == code
    out = capsys.readouterr().out
    assert out.startswith(f"tokenizer-check: {word}")


def test_cli_compatible_and_json(tmp_path, dirs, capsys):
    d = write_kimi_tokenizer(tmp_path / "d", n_ranks=N, chat_template="{{ messages }}")
    assert main(["tokenizer-check", str(dirs["target"]), str(d)]) == 0
    assert "COMPATIBLE" in capsys.readouterr().out
    assert main(["tokenizer-check", str(dirs["target"]), str(dirs["shifted_ranks"]), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["verdict"] == "incompatible"
    assert rep["first_rank_mismatch"]["rank"] == 300
    assert rep["target"]["n_ranks"] == N and rep["target"]["eos_token_id"] == N + 1
    assert any("first differing rank 300" in r for r in rep["reasons"])


def test_cli_bad_input(tmp_path, dirs, capsys):
    d = _corrupt(tmp_path, dirs, 17, "garbage")
    assert main(["tokenizer-check", str(dirs["target"]), str(d)]) == 2
    err = capsys.readouterr().err
    assert "tokenizer-check: error:" in err and "tiktoken.model line 17" in err
    assert main(["tokenizer-check", str(dirs["target"]), str(tmp_path / "none"), "--json"]) == 2
    rep = json.loads(capsys.readouterr().out)
    assert rep["verdict"] == "error" and "no such directory" in rep["error"]

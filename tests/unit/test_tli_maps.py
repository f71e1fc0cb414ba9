"""Index maps for ``kimi_tli`` drafting (vllm_kimi_ext.drafts.tli), built from real
tokenizer files: Kimi-format rank files and Hugging Face tokenizer.json vocabularies."""

from __future__ import annotations

import json

import pytest
import torch

from testkit.tli_scenarios import write_hf_bytelevel_tokenizer
from testkit.tokenizers import write_kimi_tokenizer, write_rank_file
from vllm_kimi_ext.drafts.tli import TLIConfigError, build_tli_maps, project_inputs
from vllm_kimi_ext.tokenizers.loading import tokenizer_kind, vocab_keys

N = 512


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_kimi_tokenizer(tmp_path_factory.mktemp("target"), n_ranks=N)


@pytest.fixture(scope="module")
def reordered_draft(tmp_path_factory, target):
    """The target's multi-byte tokens minus every 5th, reversed, plus 3 new ones."""
    keys = vocab_keys(target)
    singles = [bytes([b]) for b in range(256)]
    multi = [k for k in keys[:N] if isinstance(k, bytes) and len(k) > 1]
    kept = [k for i, k in enumerate(multi) if i % 5]
    new = [b"zzqx#", b"qqqj#", b"xjxj#"]
    ranks = singles + (kept + new)[::-1]
    d = tmp_path_factory.mktemp("draft")
    write_kimi_tokenizer(d, n_ranks=len(ranks))
    write_rank_file(d / "tiktoken.model", ranks)
    return d, multi, kept, ranks


def test_identical_tokenizers_map_every_regular_token_to_itself(target, tmp_path):
    draft = write_kimi_tokenizer(tmp_path / "d", n_ranks=N)
    maps = build_tli_maps(target, draft, target_vocab_size=N + 256, draft_vocab_size=N + 256)
    assert maps.shared_regular == maps.target_regular == N
    shared = maps.shared_target_ids
    assert torch.equal(maps.shared_draft_ids, shared)
    assert torch.equal(maps.target_to_draft_input[:N], torch.arange(N))
    assert maps.num_suffix_inputs == 0
    # named specials are shared, reserved fillers are not
    assert "<think>" in maps.shared_special and "<|im_end|>" in maps.shared_special
    assert not any(s.startswith("<|reserved_token_") for s in maps.shared_special)


def test_reordered_draft_maps_by_bytes_and_falls_back_to_longest_suffix(target, reordered_draft):
    d, multi, kept, ranks = reordered_draft
    t_keys = vocab_keys(target)
    d_index = {k: i for i, k in enumerate(ranks)}
    maps = build_tli_maps(target, d, target_vocab_size=N + 300, draft_vocab_size=len(ranks) + 256)
    assert maps.target_vocab_size == N + 300 and maps.draft_vocab_size == len(ranks) + 256
    assert maps.shared_regular == 256 + len(kept)
    for t, dd in zip(maps.shared_target_ids.tolist(), maps.shared_draft_ids.tolist()):
        if t < N:
            assert ranks[dd] == t_keys[t]
    dropped = [k for k in multi if k not in set(kept)]
    assert dropped
    table = maps.target_to_draft_input
    for tok in dropped:
        tid = t_keys.index(tok)
        chosen = ranks[int(table[tid])]
        assert tok.endswith(chosen)
        longer = [tok[s:] for s in range(len(tok) - len(chosen)) if tok[s:] in d_index]
        assert not longer, (tok, chosen, longer)
    assert maps.num_suffix_inputs >= len(dropped)
    # ids past the tokenizer (model padding) project to the default id
    assert int(table[N + 299]) == maps.default_input_id
    s = maps.summary()
    assert s["shared_tokens"] == maps.intersection.size
    assert "by longest suffix" in maps.describe()


def test_scatter_softmax_is_the_restricted_renormalized_distribution(target, reordered_draft):
    d, _, _, ranks = reordered_draft
    maps = build_tli_maps(target, d)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, maps.draft_vocab_size, generator=g, dtype=torch.float64) * 3
    proposal = maps.scatter_logits(logits)
    assert proposal.shape == (5, maps.target_vocab_size)
    expected = maps.intersection.map_probs(torch.softmax(logits, dim=-1))
    torch.testing.assert_close(torch.softmax(proposal, dim=-1), expected, rtol=1e-12, atol=1e-15)
    off = torch.ones(maps.target_vocab_size, dtype=torch.bool)
    off[maps.shared_target_ids] = False
    assert torch.isneginf(proposal[:, off]).all()


def test_project_inputs_keeps_dtype_and_clamps_padding():
    table = torch.tensor([5, 6, 7], dtype=torch.int32)
    ids = torch.tensor([2, 0, 9, -1], dtype=torch.int32)
    out = project_inputs(ids, table)
    assert out.dtype == torch.int32 and out.tolist() == [7, 5, 7, 5]


def test_hf_bytelevel_tokenizer_round_trips_bytes_and_matches_special_names(target, tmp_path):
    tokens = [bytes([b]) for b in range(256)] + [b" the", "你".encode(), b"\n\n", b"zq#"]
    d = write_hf_bytelevel_tokenizer(tmp_path / "hf", tokens,
                                     added={300: "<|im_end|>", 301: "<think>", 302: "<|eot|>"})
    assert tokenizer_kind(d) == "hf"
    keys = vocab_keys(d)
    assert keys[:len(tokens)] == tokens
    assert keys[300] == "<|im_end|>" and keys[len(tokens)] is None
    maps = build_tli_maps(target, d)
    t_keys = vocab_keys(target)
    pairs = dict(zip(maps.shared_draft_ids.tolist(), maps.shared_target_ids.tolist()))
    assert t_keys[pairs[300]] == "<|im_end|>" and t_keys[pairs[301]] == "<think>"
    assert 302 not in pairs  # the target has no <|eot|>
    assert 259 not in pairs  # "zq#" is not a target token
    assert all(t_keys[pairs[i]] == tokens[i] for i in range(256))


def test_sentencepiece_style_vocab_with_byte_fallback(tmp_path):
    data = {"model": {"type": "BPE", "byte_fallback": True,
                      "vocab": {"<0x0A>": 0, "\u2581the": 1, "ab": 2}},
            "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]},
            "added_tokens": [{"id": 3, "content": "</s>", "special": True}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    assert vocab_keys(tmp_path) == [b"\n", b" the", b"ab", "</s>"]


@pytest.mark.parametrize("case,message", [
    ("no_tokenizer", "no tokenizer found"),
    ("wordpiece", "not supported for cross-tokenizer"),
    ("bad_char", "outside the byte-level alphabet"),
    ("too_big", "does not belong to this model"),
    ("disjoint", "share 0 tokens"),
    ("min_shared", "required"),
])
def test_refusals_name_the_problem(target, tmp_path, case, message):
    d = tmp_path / "d"
    d.mkdir()
    kwargs = {}
    if case == "wordpiece":
        (d / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece",
                                                                "vocab": {"a": 0}}}))
    elif case == "bad_char":
        (d / "tokenizer.json").write_text(json.dumps({
            "model": {"type": "BPE", "vocab": {"a\u0100\u4e00": 0}},
            "decoder": {"type": "ByteLevel"}}))
    elif case == "too_big":
        write_kimi_tokenizer(d, n_ranks=N)
        kwargs["draft_vocab_size"] = N
    elif case == "disjoint":
        write_hf_bytelevel_tokenizer(d, [b"\xff\xfe\xfd#"])
    elif case == "min_shared":
        write_kimi_tokenizer(d, n_ranks=N)
        kwargs["min_shared_tokens"] = 10_000
    with pytest.raises(TLIConfigError) as err:
        build_tli_maps(target, d, **kwargs)
    assert message in str(err.value)


def test_tli_check_cli(target, reordered_draft, tmp_path, capsys):
    from vllm_kimi_ext.cli import main

    d = reordered_draft[0]
    assert main(["draft", "tli-check", "--target", str(target), "--draft", str(d)]) == 0
    out = capsys.readouterr().out
    assert "shared tokens" in out and "<think>" in out
    assert main(["draft", "tli-check", "--target", str(target), "--draft", str(d), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert 0.7 < summary["shared_regular_fraction"] < 1.0
    assert main(["draft", "tli-check", "--target", str(target), "--draft", str(d),
                 "--min-shared-fraction", "0.99"]) == 1
    assert "below --min-shared-fraction" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["draft", "tli-check", "--target", str(target),
                 "--draft", str(tmp_path / "empty")]) == 2
    assert "no tokenizer found" in capsys.readouterr().err


def test_gather_form_equals_the_reference_scatter(target, reordered_draft):
    from vllm_kimi_ext.drafts.tli import gather_table, gather_to_target, scatter_to_target

    maps = build_tli_maps(target, reordered_draft[0])
    table = gather_table(maps.intersection)
    assert table.dtype == torch.int32 and table.numel() == maps.target_vocab_size
    logits = torch.randn(4, maps.draft_vocab_size, dtype=torch.bfloat16)
    assert torch.equal(gather_to_target(logits, table), scatter_to_target(
        logits, maps.shared_draft_ids, maps.shared_target_ids, maps.target_vocab_size))

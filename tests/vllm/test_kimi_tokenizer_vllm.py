"""vLLM 0.34.0 loads a generated Kimi-format tokenizer directory offline.

vLLM has no built-in Kimi-K2/K2.5 tokenizer mode (``vllm/tokenizers/`` only has
``kimi_audio``, hard-wired to Kimi-Audio's ids): ``tokenizer_mode="auto"`` falls
back to ``hf``, i.e. ``AutoTokenizer.from_pretrained(..., trust_remote_code=...)``,
which imports the directory's ``tokenization_kimi.py`` through ``auto_map``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
tiktoken = pytest.importorskip("tiktoken")

from vllm.tokenizers import get_tokenizer
from vllm.tokenizers.detokenizer_utils import detokenize_incrementally

from testkit.tokenizers import (
    KIMI_PAT_STR,
    build_ranks,
    kimi_special_tokens,
    write_kimi_tokenizer,
)

pytestmark = pytest.mark.vllm

N = 1024
TEXTS = [
    "Hello world! The draft model proposes three tokens per step.",
    "I'm sure it's fine, but we'd rather verify: don't we?",
    "def f(x):\n    return x + 12345678  # comment\n\n\t  trailing   ",
    "混合文本：你好世界，这是一个测试。 mixed with English",
    "emoji \U0001f680 and accents: café, naïve, Ærøskøbing",
    "",
]


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory):
    # config.json spares vLLM's get_config a retry loop on a tokenizer-only directory
    return write_kimi_tokenizer(
        tmp_path_factory.mktemp("kimi") / "tok", n_ranks=N, config_vocab_size=N + 256
    )


@pytest.fixture(scope="module")
def tok(kimi_dir):
    return get_tokenizer(str(kimi_dir), trust_remote_code=True)


@pytest.fixture(scope="module")
def reference():
    """The same tokenizer built directly with tiktoken from the generated files."""
    ranks = {t: i for i, t in enumerate(build_ranks(N))}
    specials = {name: i for i, name in kimi_special_tokens(N).items()}
    return tiktoken.Encoding(
        "kimi-test", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens=specials
    )


def test_loads_through_remote_code(tok):
    assert type(tok).__mro__[1].__name__ == "TikTokenTokenizer"
    assert len(tok) == N + 256 and tok.max_token_id == N + 255
    assert tok.bos_token_id == N and tok.eos_token_id == N + 1 and tok.pad_token_id == N + 255


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip(tok, reference, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == reference.encode(text)  # Kimi's regex, not cl100k's
    assert tok.decode(ids) == text
    assert all(0 <= i < N for i in ids)


def test_special_tokens(tok, reference):
    text = "<|im_user|>user<|im_middle|>hi<|im_end|><think>why</think><|tool_calls_section_begin|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == reference.encode(text, allowed_special="all")
    assert ids[0] == N + 3 and ids[-1] == N + 11
    assert N + 22 in ids and N + 23 in ids
    assert tok.decode(ids) == text
    assert tok.convert_tokens_to_ids("</think>") == N + 23
    assert tok.convert_ids_to_tokens([N + 6]) == ["<|start_header_id|>"]
    assert tok.decode([N + 100]) == f"<|reserved_token_{N + 100}|>"
    # Kimi keeps <think> / tool markers when special tokens are skipped; drops [EOS]
    kept = tok.decode(ids + [N + 1], skip_special_tokens=True)
    assert "<think>why</think><|tool_calls_section_begin|>" in kept
    assert "[EOS]" not in kept and "<|im_end|>" not in kept


def test_chat_template(tok):
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2?"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_system|>system<|im_middle|>be brief<|im_end|>"
        "<|im_user|>user<|im_middle|>2+2?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == N + 10 and ids[-1] == N + 22


def test_incremental_detokenization(tok):
    text = "Prefix <think>思考 \U0001f680 done</think> café"
    ids = tok.encode(text, add_special_tokens=False)
    prompt = tok.encode("<|im_user|>hi", add_special_tokens=False)
    all_ids = list(prompt)
    tokens, prefix, read, out = None, 0, 0, ""
    for t in ids:
        all_ids.append(t)
        new_tokens, piece, prefix, read = detokenize_incrementally(
            tok, all_ids, tokens, prefix, read, spaces_between_special_tokens=False
        )
        tokens = new_tokens if tokens is None else tokens + new_tokens
        out += piece
    assert out.endswith(text)


def test_refuses_without_trust_remote_code(kimi_dir):
    with pytest.raises(Exception, match="trust_remote_code|custom code"):
        get_tokenizer(str(kimi_dir), trust_remote_code=False)


def test_without_remote_code_transformers_uses_the_wrong_regex(tmp_path, reference, monkeypatch):
    """Documented trap: without tokenization_kimi.py, transformers' tiktoken fallback
    (TikTokenConverter) loads the rank file with cl100k's pre-tokenizer regex, so
    ids are valid but segmentation differs from Kimi's (contractions, Han runs)."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken caches local files by path
    d = write_kimi_tokenizer(
        tmp_path / "plain", n_ranks=N, remote_code=False, config_vocab_size=N + 256
    )
    plain = get_tokenizer(str(d))
    assert len(plain) == N + 256
    differs = [t for t in TEXTS if plain.encode(t, add_special_tokens=False) != reference.encode(t)]
    assert differs, "transformers now applies Kimi's regex; revisit docs/tokenizers.md"

"""Kimi tiktoken tokenizer for transformers' ``AutoTokenizer`` (remote-code file).

This file is copied next to a ``tiktoken.model`` rank file and referenced from
``tokenizer_config.json`` (``"auto_map": {"AutoTokenizer":
["tokenization_kimi.TikTokenTokenizer", null]}``), the layout Kimi checkpoints use.
transformers imports it as a dynamic module when ``trust_remote_code=True``, so it
must stay self-contained: it imports only tiktoken and transformers.

Semantics follow Kimi's loader: ids ``[0, n_ranks)`` are the rank file's tokens,
ids ``[n_ranks, n_ranks + 256)`` are reserved special tokens named by
``added_tokens_decoder`` (unnamed ones are ``<|reserved_token_{id}|>``); text is
split with Kimi's pre-tokenizer regex (``pat_str`` in the config overrides it).
Tokens are exposed as GPT-2 style byte-level strings so that
``convert_tokens_to_string`` can reassemble partial UTF-8 sequences (what vLLM's
incremental detokenizer relies on).

The rank file is parsed here rather than with ``tiktoken.load.load_tiktoken_bpe``
because that function caches local files under a key derived from the *path*
only: rewriting a rank file at the same path silently keeps serving the old one.
"""

from __future__ import annotations

import base64
import os
import shutil
from typing import Any, ClassVar

import tiktoken
from transformers import AddedToken, PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}

NUM_RESERVED_SPECIAL_TOKENS = 256

KIMI_PAT_STR = (
    r"""[\p{Han}]+"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
    r"""[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
    r"""[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+"""
    r"""|\s+(?!\S)"""
    r"""|\s+"""
)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _load_ranks(path: str) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                token_b64, rank = line.split()
                ranks[base64.b64decode(token_b64, validate=True)] = int(rank)
            except ValueError as exc:
                raise ValueError(f"{path} line {lineno}: not '<base64> <rank>': {line!r}") from exc
    return ranks


def _content(token: Any) -> str:
    if isinstance(token, AddedToken):
        return token.content
    if isinstance(token, dict):
        return token["content"]
    return str(token)


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names: ClassVar[list[str]] = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str,
        bos_token: str | None = "[BOS]",
        eos_token: str | None = "[EOS]",
        unk_token: str | None = None,
        pad_token: str | None = None,
        added_tokens_decoder: dict | None = None,
        pat_str: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.vocab_file = vocab_file
        ranks = _load_ranks(vocab_file)
        self.num_base_tokens = len(ranks)
        n = self.num_base_tokens

        declared = {int(i): tok for i, tok in (added_tokens_decoder or {}).items()}
        added: dict[int, AddedToken] = {}
        for tid in range(n, n + NUM_RESERVED_SPECIAL_TOKENS):
            tok = declared.get(tid)
            if tok is None:
                added[tid] = AddedToken(f"<|reserved_token_{tid}|>", normalized=False, special=True)
            elif isinstance(tok, AddedToken):
                added[tid] = tok
            elif isinstance(tok, dict):
                added[tid] = AddedToken(
                    tok["content"],
                    lstrip=tok.get("lstrip", False),
                    rstrip=tok.get("rstrip", False),
                    single_word=tok.get("single_word", False),
                    normalized=tok.get("normalized", False),
                    special=tok.get("special", True),
                )
            else:
                added[tid] = AddedToken(str(tok), normalized=False, special=True)
        self.special_tokens = {tok.content: tid for tid, tok in added.items()}

        self.pat_str = pat_str or KIMI_PAT_STR
        self.model = tiktoken.Encoding(
            name=os.path.basename(vocab_file),
            pat_str=self.pat_str,
            mergeable_ranks=ranks,
            special_tokens=self.special_tokens,
        )
        self._byte_encoder = _byte_to_unicode()
        self._byte_decoder = {c: b for b, c in self._byte_encoder.items()}
        self.encoder: dict[str, int] = {self._to_str(tok): rank for tok, rank in ranks.items()}
        self.decoder: dict[int, str] = {rank: s for s, rank in self.encoder.items()}
        for content, tid in self.special_tokens.items():
            self.encoder[content] = tid
            self.decoder[tid] = content
        self._added_tokens_decoder = added

        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            pat_str=pat_str,
            **kwargs,
        )

    # ------------------------------------------------------------------ vocab

    def _to_str(self, token: bytes) -> str:
        return "".join(self._byte_encoder[b] for b in token)

    @property
    def vocab_size(self) -> int:
        return self.num_base_tokens + NUM_RESERVED_SPECIAL_TOKENS

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    # ------------------------------------------------------------- tokenizing

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        # Special tokens were already split off by PythonBackend.tokenize, so any
        # special-looking text left here is plain text.
        return [self.decoder[i] for i in self.model.encode_ordinary(text)]

    def _convert_token_to_id(self, token: str) -> int:
        tid = self.encoder.get(token)
        if tid is None:
            tid = self.encoder.get(str(self.unk_token)) if self.unk_token is not None else None
        if tid is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return tid

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder.get(int(index), "")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        out = bytearray()
        for token in tokens:
            if token in self.special_tokens:
                out += token.encode("utf-8")
            else:
                out += bytes(self._byte_decoder[c] for c in token)
        return out.decode("utf-8", errors="replace")

    def build_inputs_with_special_tokens(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        # Kimi adds no BOS/EOS when encoding; the chat template carries the markers.
        return list(token_ids_0) + (list(token_ids_1) if token_ids_1 else [])

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 0

    def save_vocabulary(
        self, save_directory: str, filename_prefix: str | None = None
    ) -> tuple[str, ...]:
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"]
        out = os.path.join(save_directory, name)
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, out)
        return (out,)


__all__ = ["KIMI_PAT_STR", "TikTokenTokenizer"]

"""Offline writer of Kimi-format tokenizer directories for tests.

Kimi-K2 / K2.5 / Moonlight / Kimi-VL repositories ship a tiktoken rank file
(``tiktoken.model``: one ``<base64 token bytes> <rank>`` line per regular token,
163584 ranks for the real model) plus a ``tokenizer_config.json`` whose
``added_tokens_decoder`` names the 256 reserved ids that follow the ranks
(``[BOS]`` at ``n_ranks``, ``[EOS]`` at ``n_ranks + 1``, ...).  Unnamed reserved
slots are called ``<|reserved_token_{id}|>`` by Kimi's own loader, so that is the
name we write for them too.

Nothing here downloads anything: the rank file is built by a small deterministic
byte-level BPE over a generated corpus (English-like sentences, code, numbers and
some Han text, pre-tokenized with Kimi's regex), topped up with deterministic
pseudo-random concatenations of existing tokens when the corpus runs out of
merges (so any size, including the real 163584, can be written).  Each token
beyond the 256 single bytes is the concatenation of two lower-ranked tokens, as
in a real BPE, so tiktoken and a HuggingFace BPE built from the file agree.

A written directory is loadable by vLLM's tokenizer path (``tokenizer_mode``
"auto" -> transformers ``AutoTokenizer``) with ``trust_remote_code=True``: next to
the rank file we copy ``tokenization_kimi.py`` (our own implementation, in
``vllm_kimi_ext/tokenizers/``) and point ``auto_map`` at it, exactly how the real
checkpoints are laid out.

Variants for tests (see :func:`write_variant`): ``identical``, ``special_rename``,
``special_move`` (special-token drift), ``shifted_ranks`` (two ranks swapped) and
``different_size``.
"""

from __future__ import annotations

import base64
import functools
import heapq
import json
import random
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from itertools import pairwise
from pathlib import Path

__all__ = [
    "KIMI_CHAT_TEMPLATE",
    "KIMI_PAT_STR",
    "KIMI_SPECIAL_TOKEN_OFFSETS",
    "NON_SPECIAL_ADDED_TOKENS",
    "NUM_RESERVED_SPECIAL_TOKENS",
    "REAL_KIMI_N_RANKS",
    "VARIANTS",
    "build_ranks",
    "kimi_special_tokens",
    "reserved_token_name",
    "write_kimi_tokenizer",
    "write_rank_file",
    "write_variant",
]

# Kimi's pre-tokenizer regex and the reserved-slot count live in the standalone
# remote-code module copied into every written directory (it must not import this
# package); use them from there rather than keeping a second copy.
from vllm_kimi_ext.tokenizers import tokenization_kimi  # noqa: E402
from vllm_kimi_ext.tokenizers.tokenization_kimi import (  # noqa: E402
    KIMI_PAT_STR,
    NUM_RESERVED_SPECIAL_TOKENS,
)

REAL_KIMI_N_RANKS = 163584

#: Named reserved slots, as offsets from ``n_ranks`` (Kimi-K2.5 layout).  The
#: ids of ``<|im_end|>`` (+2), the tool-call markers (+11..+15), ``<|media_pad|>``
#: (+21), ``<think>`` (+22) and ``</think>`` (+23) are confirmed by vLLM's own
#: Kimi-K2.5 test data and configs; the others follow the public repositories.
KIMI_SPECIAL_TOKEN_OFFSETS: dict[int, str] = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    18: "<|media_begin|>",
    19: "<|media_content|>",
    20: "<|media_end|>",
    21: "<|media_pad|>",
    22: "<think>",
    23: "</think>",
    254: "[UNK]",
    255: "[PAD]",
}

#: Added tokens Kimi marks ``"special": false`` so that decoding with
#: ``skip_special_tokens=True`` keeps them (reasoning and tool-call parsers need them).
NON_SPECIAL_ADDED_TOKENS = frozenset(
    {
        "<think>",
        "</think>",
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    }
)

#: A Kimi-style chat template (our own wording of the K2.5 conventions): roles as
#: ``<|im_user|>user<|im_middle|>...<|im_end|>``, reasoning in ``<think>...</think>``,
#: tool calls in a ``<|tool_calls_section_begin|>`` section, images as media tokens.
KIMI_CHAT_TEMPLATE = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content -%}{%- for part in content -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- elif part['type'] in ('image', 'image_url') -%}"
    "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "<|im_system|>system<|im_middle|>{{ render_content(message['content']) }}<|im_end|>"
    "{%- elif message['role'] == 'user' -%}"
    "<|im_user|>user<|im_middle|>{{ render_content(message['content']) }}<|im_end|>"
    "{%- elif message['role'] == 'tool' -%}"
    "<|im_system|>tool<|im_middle|>## Return of {{ message.get('tool_call_id', '') }}\n"
    "{{ render_content(message['content']) }}<|im_end|>"
    "{%- elif message['role'] == 'assistant' -%}"
    "<|im_assistant|>assistant<|im_middle|>"
    "<think>{{ message.get('reasoning_content') or '' }}</think>"
    "{{ render_content(message.get('content')) }}"
    "{%- if message.get('tool_calls') -%}<|tool_calls_section_begin|>"
    "{%- for call in message['tool_calls'] -%}"
    "<|tool_call_begin|>{{ call['id'] }}<|tool_call_argument_begin|>"
    "{%- if call['function']['arguments'] is string -%}{{ call['function']['arguments'] }}"
    "{%- else -%}{{ call['function']['arguments'] | tojson }}{%- endif -%}"
    "<|tool_call_end|>"
    "{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}"
    "<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and thinking is false -%}<think></think>"
    "{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}"
)

#: Names accepted by :func:`write_variant`.
VARIANTS = ("identical", "special_rename", "special_move", "shifted_ranks", "different_size")

#: the remote-code module as the package ships it (copied into every written directory)
_REMOTE_CODE_FILE = Path(tokenization_kimi.__file__).resolve()


def reserved_token_name(token_id: int) -> str:
    """Kimi's name for an unnamed reserved slot (keyed by the absolute id)."""
    return f"<|reserved_token_{token_id}|>"


def kimi_special_tokens(n_ranks: int) -> dict[int, str]:
    """All 256 reserved ids after ``n_ranks`` with Kimi's names (filler for unnamed slots)."""
    return {
        n_ranks + off: KIMI_SPECIAL_TOKEN_OFFSETS.get(off, reserved_token_name(n_ranks + off))
        for off in range(NUM_RESERVED_SPECIAL_TOKENS)
    }


# --------------------------------------------------------------------------- corpus


class _SplitMix64:
    """Tiny PRNG with a fixed algorithm, so generated files never depend on the
    Python version's ``random`` implementation."""

    _MASK = (1 << 64) - 1

    def __init__(self, seed: int) -> None:
        self.state = (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E5F5) & self._MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & self._MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self._MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self._MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n

    def choice(self, seq):
        return seq[self.below(len(seq))]

    def zipf_index(self, n: int) -> int:
        """Index in [0, n) with a heavy head (roughly Zipfian)."""
        u = (self.next() >> 11) / float(1 << 53)
        return min(n - 1, int(n**u) - 1)


_WORDS_TEXT = (
    "the of and to in is that it for was on are as with be by this at from or have an "
    "they which one you were her all she there would their we him been has when who will "
    "more no if out so said what up its about into than them can only other new some "
    "could time these two may then do first any my now such like our over man me even "
    "most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go came "
    "right used take three model token tokens draft target decode verify accept reject "
    "sample probability vocabulary tensor parallel speculative kernel memory bandwidth "
    "latency throughput batch sequence attention expert router layer weight gradient "
    "function return import class self value string number list dict print error "
    "request response server client config option default result output input"
)
_WORDS = tuple(_WORDS_TEXT.split())

_SYLLABLES_TEXT = (
    "ka ri to na me so lu pe mi ra no shi ta ke ro ma ni ko sa mu tion ing er est ly "
    "ment ness able ous ive al ic ize pre re un dis con pro in ex ble ward ful less"
)
_SYLLABLES = tuple(_SYLLABLES_TEXT.split())

_CODE_LINES = (
    "def {w}_{v}(x, y):\n    return x + y * {n}\n",
    "for i in range({n}):\n    total += values[i]\n",
    'if {w} is None:\n    raise ValueError("missing {v}")\n',
    "{w} = torch.zeros({n}, dtype=torch.float32)\n",
    'print(f"{{{w}}} -> {{{v}}}")\n',
    '{{"{w}": {n}, "{v}": [{n}, {m}]}}\n',
    "class {W}{V}:\n    def __init__(self):\n        self.{w} = {n}\n",
)

_HAN = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处理世界你好我们学习中文模型数据"

# ------------------------------------------------------------------------------------------


def _corpus(seed: int, n_sentences: int = 4000) -> str:
    rng = _SplitMix64(seed)
    pseudo = []
    for _ in range(2500):
        pseudo.append("".join(rng.choice(_SYLLABLES) for _ in range(1 + rng.below(4))))
    lexicon = list(_WORDS) + pseudo
    if seed:  # the seed also perturbs word frequencies locally, so merge orders differ
        for i in range(len(lexicon) - 1):
            j = min(len(lexicon) - 1, i + rng.below(24))
            lexicon[i], lexicon[j] = lexicon[j], lexicon[i]
    parts: list[str] = []
    for _ in range(n_sentences):
        kind = rng.below(10)
        if kind < 6:
            n = 4 + rng.below(11)
            words = [lexicon[rng.zipf_index(len(lexicon))] for _ in range(n)]
            if rng.below(5) == 0:
                words.insert(rng.below(n), str(rng.below(100000)))
            if rng.below(6) == 0:
                words[rng.below(n)] = rng.choice(["it's", "don't", "I'm", "we've", "they'll"])
            sentence = " ".join(words)
            sentence = sentence[:1].upper() + sentence[1:]
            parts.append(sentence + rng.choice([". ", ". ", "? ", "! ", ".\n", ", and "]))
        elif kind < 8:
            tmpl = rng.choice(_CODE_LINES)
            w = rng.choice(_WORDS[-40:])
            v = lexicon[rng.zipf_index(len(lexicon))]
            parts.append(
                tmpl.format(
                    w=w, v=v, W=w.capitalize(), V=v.capitalize(), n=rng.below(4096), m=rng.below(64)
                )
            )
        else:
            start = rng.below(len(_HAN) - 12)
            parts.append(_HAN[start : start + 2 + rng.below(10)] + rng.choice(["。", "，", "\n"]))
    return "".join(parts)


def _pretokenize(text: str) -> Counter:
    import regex  # a transformers dependency; only needed when building ranks

    pattern = regex.compile("(?V1)" + KIMI_PAT_STR)
    return Counter(piece.encode("utf-8") for piece in pattern.findall(text))


def _bpe(word_counts: Mapping[bytes, int], max_new: int, known: set[bytes]) -> list[bytes]:
    """Byte-level BPE: up to ``max_new`` new tokens, most frequent pair first
    (ties broken by the pair's bytes), each the concatenation of two known tokens."""
    words = [[bytes([b]) for b in w] for w in sorted(word_counts)]
    counts = [word_counts[w] for w in sorted(word_counts)]
    pair_count: dict[tuple[bytes, bytes], int] = defaultdict(int)
    pair_words: dict[tuple[bytes, bytes], set[int]] = defaultdict(set)
    for i, syms in enumerate(words):
        for pair in pairwise(syms):
            pair_count[pair] += counts[i]
            pair_words[pair].add(i)
    heap = [(-c, a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)
    new_tokens: list[bytes] = []
    while heap and len(new_tokens) < max_new:
        negc, a, b = heapq.heappop(heap)
        c = pair_count.get((a, b), 0)
        if c != -negc:
            continue  # stale entry; a fresh one was pushed when the count changed
        if c < 2:
            break
        merged = a + b
        if merged not in known:
            known.add(merged)
            new_tokens.append(merged)
        changed: set[tuple[bytes, bytes]] = set()
        for i in list(pair_words[(a, b)]):
            syms = words[i]
            cnt = counts[i]
            for pair in pairwise(syms):
                pair_count[pair] -= cnt
                changed.add(pair)
            out: list[bytes] = []
            j = 0
            while j < len(syms):
                if j + 1 < len(syms) and syms[j] == a and syms[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            words[i] = out
            for pair in pairwise(out):
                pair_count[pair] += cnt
                pair_words[pair].add(i)
                changed.add(pair)
        pair_count.pop((a, b), None)
        for pair in changed:
            c2 = pair_count.get(pair, 0)
            if c2 > 0:
                heapq.heappush(heap, (-c2, pair[0], pair[1]))
    return new_tokens


@functools.lru_cache(maxsize=8)
def _bpe_tokens(seed: int, max_bpe_merges: int) -> tuple[bytes, ...]:
    """All merges of the seed's corpus (up to the cap); smaller sizes take a prefix."""
    known = {bytes([i]) for i in range(256)}
    return tuple(_bpe(_pretokenize(_corpus(seed)), max_bpe_merges, known))


@functools.lru_cache(maxsize=16)
def _build_ranks_cached(n_ranks: int, seed: int, max_bpe_merges: int) -> tuple[bytes, ...]:
    tokens = [bytes([i]) for i in range(256)]
    if n_ranks <= 256:
        return tuple(tokens[:n_ranks])
    tokens += _bpe_tokens(seed, max_bpe_merges)[: n_ranks - 256]
    known = set(tokens)
    # Top up with deterministic concatenations of existing tokens (short ones).
    # random.Random(int).random() is the same Mersenne Twister stream on every
    # CPython 3 version, and much faster than the pure-Python generator above.
    rnd = random.Random(seed ^ 0x5EED)
    uniform = rnd.random
    attempts = 0
    while len(tokens) < n_ranks:
        attempts += 1
        if attempts > 50 * n_ranks + 10_000:
            raise RuntimeError(f"could not generate {n_ranks} distinct tokens")
        hi = len(tokens) - 32  # skip the control bytes 0..31
        a = tokens[31 + min(hi, int(hi ** uniform()))]  # heavy head: frequent tokens
        b = tokens[32 + int(hi * uniform())]
        merged = a + b
        if len(merged) > 16 or merged in known:
            continue
        known.add(merged)
        tokens.append(merged)
    return tuple(tokens)


def build_ranks(n_ranks: int = 2048, seed: int = 0, *, max_bpe_merges: int = 6000) -> list[bytes]:
    """Token byte strings in rank order (rank = index), deterministic in
    ``(n_ranks, seed)``.  The first 256 are the single bytes 0..255."""
    if n_ranks < 256:
        raise ValueError(f"n_ranks must be >= 256 (all single bytes), got {n_ranks}")
    return list(_build_ranks_cached(int(n_ranks), int(seed), int(max_bpe_merges)))


def write_rank_file(path: str | Path, tokens: Iterable[bytes]) -> Path:
    """Write ``<base64> <rank>`` lines, rank = position."""
    path = Path(path)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.writelines(
            f"{base64.b64encode(tok).decode('ascii')} {rank}\n" for rank, tok in enumerate(tokens)
        )
    return path


# ------------------------------------------------------------------------------------------


def _added_token_entry(content: str) -> dict:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": content not in NON_SPECIAL_ADDED_TOKENS,
    }


def write_kimi_tokenizer(
    directory: str | Path,
    *,
    n_ranks: int = 2048,
    seed: int = 0,
    special_tokens: Mapping[int, str] | None = None,
    rename_special: Mapping[int, str] | None = None,
    swap_ranks: tuple[int, int] | None = None,
    bos_token: str | None = "[BOS]",
    eos_token: str | None = "[EOS]",
    pad_token: str | None = "[PAD]",
    unk_token: str | None = "[UNK]",
    chat_template: str | None = KIMI_CHAT_TEMPLATE,
    config_vocab_size: int | None = None,
    remote_code: bool = True,
) -> Path:
    """Write a Kimi-format tokenizer directory and return its path.

    ``special_tokens`` (absolute id -> name) replaces the default layout from
    :func:`kimi_special_tokens`; ``rename_special`` patches single ids of it.
    ``swap_ranks=(i, j)`` swaps the byte strings at ranks ``i`` and ``j``.
    ``config_vocab_size`` additionally writes a minimal ``config.json``
    (``model_type: kimi_k2``) with that ``vocab_size``.  ``remote_code`` copies
    our ``tokenization_kimi.py`` and sets ``auto_map`` so that
    ``AutoTokenizer(..., trust_remote_code=True)`` -- and so vLLM -- can load it.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokens = build_ranks(n_ranks, seed)
    if swap_ranks is not None:
        i, j = swap_ranks
        tokens[i], tokens[j] = tokens[j], tokens[i]
    write_rank_file(directory / "tiktoken.model", tokens)

    specials = dict(kimi_special_tokens(n_ranks) if special_tokens is None else special_tokens)
    for tid, name in (rename_special or {}).items():
        specials[int(tid)] = name
    named = [
        name
        for _, name in sorted(specials.items())
        if not name.startswith("<|reserved_token_")
        and name not in NON_SPECIAL_ADDED_TOKENS
        and name not in (bos_token, eos_token, pad_token, unk_token)
    ]
    config: dict = {
        "added_tokens_decoder": {
            str(tid): _added_token_entry(name) for tid, name in sorted(specials.items())
        },
        "additional_special_tokens": named,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "pad_token": pad_token,
        "unk_token": unk_token,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
        "pat_str": KIMI_PAT_STR,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    if remote_code:
        config["auto_map"] = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
        shutil.copyfile(_REMOTE_CODE_FILE, directory / "tokenization_kimi.py")
    with open(directory / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    if config_vocab_size is not None:
        with open(directory / "config.json", "w", encoding="utf-8") as f:
            json.dump(
                {
                    "architectures": ["DeepseekV3ForCausalLM"],
                    "model_type": "kimi_k2",
                    "vocab_size": int(config_vocab_size),
                    "bos_token_id": n_ranks,
                    "eos_token_id": n_ranks + 1,
                },
                f,
                indent=2,
            )
            f.write("\n")
    return directory


def write_variant(
    directory: str | Path,
    variant: str,
    *,
    n_ranks: int = 2048,
    seed: int = 0,
    **kwargs,
) -> Path:
    """Write a draft-side directory that differs from
    ``write_kimi_tokenizer(n_ranks=n_ranks, seed=seed)`` in one controlled way:

    - ``identical``: byte-identical files.
    - ``special_rename``: ``</think>`` (``n_ranks + 23``) renamed to ``<|think_end|>``.
    - ``special_move``: ``</think>`` moved from ``n_ranks + 23`` to the free slot
      ``n_ranks + 24`` (``n_ranks + 23`` becomes a reserved filler).
    - ``shifted_ranks``: ranks 300 and 301 swapped.
    - ``different_size``: ``n_ranks + 512`` ranks (so every special id moves).
    """
    if variant == "identical":
        return write_kimi_tokenizer(directory, n_ranks=n_ranks, seed=seed, **kwargs)
    if variant == "special_rename":
        return write_kimi_tokenizer(
            directory,
            n_ranks=n_ranks,
            seed=seed,
            rename_special={n_ranks + 23: "<|think_end|>"},
            **kwargs,
        )
    if variant == "special_move":
        return write_kimi_tokenizer(
            directory,
            n_ranks=n_ranks,
            seed=seed,
            rename_special={
                n_ranks + 23: reserved_token_name(n_ranks + 23),
                n_ranks + 24: "</think>",
            },
            **kwargs,
        )
    if variant == "shifted_ranks":
        return write_kimi_tokenizer(
            directory, n_ranks=n_ranks, seed=seed, swap_ranks=(300, 301), **kwargs
        )
    if variant == "different_size":
        return write_kimi_tokenizer(directory, n_ranks=n_ranks + 512, seed=seed, **kwargs)
    raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")

"""Tokenizer reading and comparison: ``tokenizer-check`` and its Python API.

- :mod:`.kimi_files`: a Kimi-format directory (tiktoken rank file +
  ``tokenizer_config.json``) parsed into :class:`~.kimi_files.KimiTokenizerFiles`;
- :mod:`.hf_json`: a Hugging Face ``tokenizer.json`` BPE vocabulary;
- :mod:`.loading`: either format as per-id keys (what cross-tokenizer drafting
  intersects);
- :mod:`.compare`: target vs. draft Kimi-format directories, a verdict and findings;
- :mod:`.errors`: :class:`TokenizerInputError`, raised by every reader.

Only the standard library is imported here; ``tokenization_kimi.py`` (the
remote-code tokenizer copied into generated tokenizer directories) needs
transformers and is never imported by the package itself.
"""

from .compare import (
    TokenizerMismatchError,
    TokenizerReport,
    check_tokenizers,
    refuse_if_incompatible,
)
from .errors import TokenizerInputError
from .kimi_files import load_tokenizer_dir
from .loading import tokenizer_kind, vocab_keys

__all__ = [
    "TokenizerInputError",
    "TokenizerMismatchError",
    "TokenizerReport",
    "check_tokenizers",
    "load_tokenizer_dir",
    "refuse_if_incompatible",
    "tokenizer_kind",
    "vocab_keys",
]

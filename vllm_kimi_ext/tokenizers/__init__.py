"""Kimi-format tokenizer tools: ``tokenizer-check`` and its Python API.

Only the standard library is imported here; ``tokenization_kimi.py`` (the
remote-code tokenizer copied into generated tokenizer directories) needs
transformers and is never imported by the package itself.
"""

from .check import (
    TokenizerInputError,
    TokenizerMismatchError,
    TokenizerReport,
    check_tokenizers,
    load_tokenizer_dir,
    refuse_if_incompatible,
)

__all__ = [
    "TokenizerInputError",
    "TokenizerMismatchError",
    "TokenizerReport",
    "check_tokenizers",
    "load_tokenizer_dir",
    "refuse_if_incompatible",
]

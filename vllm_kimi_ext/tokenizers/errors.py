"""The error every tokenizer reader raises for a missing or malformed file."""

from __future__ import annotations

from pathlib import Path

from vllm_kimi_ext.user_input import UserInputError

__all__ = ["TokenizerInputError"]


class TokenizerInputError(UserInputError):
    """A tokenizer directory is missing a file or has a malformed one (``path`` and
    ``line`` say where; the command line reports it as exit 2)."""

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None, expected: str | None = None):
        super().__init__(message, file=path, field=field, expected=expected)
        self.path = None if path is None else str(path)
        self.line = line

"""The error every tokenizer reader raises for a missing or malformed file."""

from __future__ import annotations

from pathlib import Path

__all__ = ["TokenizerInputError"]


class TokenizerInputError(ValueError):
    """A tokenizer directory is missing a file or has a malformed one."""

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)
        self.line = line

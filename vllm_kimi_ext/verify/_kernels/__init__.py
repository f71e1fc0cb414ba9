"""The step's Triton kernels, one module per round (:mod:`.stats`, :mod:`.merge`,
:mod:`.decide`, :mod:`.escalate_rows` / :mod:`.escalate_split` / :mod:`.escalate_folded`)
and their shared helpers (:mod:`.common`). Only the rounds' Triton launchers import them,
inside the launcher, so the package imports without Triton.

Importing this package is the one availability guard: without an importable Triton it
raises an ``ImportError`` that names the way out (``backend="torch"``). The first import
defines every kernel at once, so no kernel module is first imported on one thread while
another launches (Triton's CPU interpreter patches ``triton.language`` during a launch).
"""

from ..backend import require_triton

require_triton()

from . import (  # noqa: E402, F401
    common,
    decide,
    escalate_folded,
    escalate_rows,
    escalate_split,
    merge,
    stats,
)

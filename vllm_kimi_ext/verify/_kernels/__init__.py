"""The step's Triton kernels, one module per round (:mod:`.stats`, :mod:`.merge`,
:mod:`.decide`, :mod:`.escalate_rows` / :mod:`.escalate_split`) and their shared helpers
(:mod:`.common`). Only the rounds' Triton launchers import them, inside the launcher, so the
package imports without Triton.

Importing this package is the one availability guard: without an importable Triton it
raises an ``ImportError`` that names the way out (``backend="torch"``).
"""

from ..backend import require_triton

require_triton()

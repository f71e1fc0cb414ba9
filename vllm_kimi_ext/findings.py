"""One named problem (or observation) a checker reports: the project's single ``Finding`` type.

Used by the draft doctor (:mod:`vllm_kimi_ext.drafts.doctor.diagnosis`, severities ``error`` /
``warning``) and the tokenizer comparison (:mod:`vllm_kimi_ext.tokenizers.compare`,
severities ``info`` / ``compatible`` / ``incompatible``); each checker documents its codes
and severities. ``file`` and ``field`` optionally name where the problem is; they appear
in :meth:`Finding.to_dict` only when set.

Standard library only.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Finding"]


@dataclasses.dataclass(frozen=True)
class Finding:
    code: str  # stable identifier, e.g. "E-D2T-RANGE" or "rank_mismatch"
    severity: str  # the checker's own scale
    message: str  # one line naming the values involved
    file: str | None = None  # the file the finding is about, when it is about one
    field: str | None = None  # the config field / key, when it is about one

    def to_dict(self) -> dict[str, str]:
        out = {"code": self.code, "severity": self.severity, "message": self.message}
        if self.file is not None:
            out["file"] = self.file
        if self.field is not None:
            out["field"] = self.field
        return out

    def __str__(self) -> str:
        return f"{self.severity.upper()} {self.code}: {self.message}"

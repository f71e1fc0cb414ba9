"""The committed collectives-per-token table is generated and up to date."""

from __future__ import annotations

from pathlib import Path

from vllm_kimi_ext.costmodel import placement_table as pt
from vllm_kimi_ext.costmodel.acceptance import tau_from_constant_rate

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC = DOCS / pt.DOC_NAME


def test_committed_table_is_up_to_date():
    assert DOC.read_text() == pt.render(), (
        "regenerate: python -m vllm_kimi_ext.costmodel.placement_table --write-docs docs/")
    assert pt.main(["--check-docs", str(DOCS)]) == 0


def test_fit_reproduces_published_tau_and_counts():
    a = pt.rate_from_tau(3.20, 3)
    assert abs(tau_from_constant_rate(a, 3) - 3.20) < 1e-9
    assert pt.per_step(0) == 124 and pt.per_step(4 * 3) == 136
    # GSM8K, k=3: stock sharded draft (123 + 12 + 1) / 3.20, replicated embedding
    # (123 + 9 + 1) / 3.20, draft TP 1 (123 + 1 broadcast + 1) / 3.20
    assert "| 3 | 3.20 | 42.5 | 41.6 | 39.1 |" in DOC.read_text()

"""Markdown helpers shared by the generated documents (tables, signed percentages)."""

from __future__ import annotations


def _numeric(cell: str) -> bool:
    c = cell.strip("*` ")
    return bool(c) and (c[0].isdigit() or (c[0] in "+-" and len(c) > 1 and c[1].isdigit())
                        or c == "-")


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; columns whose cells are all numbers are right-aligned."""
    align = ["---:" if rows and all(_numeric(r[i]) for r in rows) else "---"
             for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def pct(x: float | None) -> str:
    if x is None:
        return "-"
    return "0%" if abs(x) < 5e-3 else f"{x:+.0%}"


def pct_range(values) -> str:
    """``low..high`` of signed percentages (None skipped), ordered."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    return f"{pct(min(vals))}..{pct(max(vals))}"

"""Git patches named by slug; their numbers are rendered from the shipped series.

Patch numbers change whenever the series is regenerated (a patch split, inserted or
reordered), so nothing in the package writes one down: code, cost-model profiles and the
generated docs name a patch by its slug (``replicate-draft-embedding``), and the number
comes from ``vllm_kimi_ext/series.json`` (written by ``nox -s apply-patches -- --export``,
which keeps each patch's slug). ``tests/unit/test_series_slugs.py`` fails on a literal patch
number in the package or in generated docs.

Profiles and other text write ``{patch:SLUG}`` or ``{patch:SLUG,SLUG}``; :func:`render`
turns it into ``patch NNNN`` / ``patches NNNN/NNNN``.

A git patch withdrawn from the series into runtime patches of the plugin keeps its slug
(:data:`WITHDRAWN`): it renders as ``runtime patch RNN``, the note
``upstream-notes/RNN-*.md`` of the runtime patch class that now carries it.
"""

from __future__ import annotations

import functools
import re

from vllm_kimi_ext import compat
from vllm_kimi_ext.patchset import SLUG_RE, PatchSetError

#: The patches a draft needs to run at ``draft_tensor_parallel_size: 1``: the EAGLE family...
DRAFT_TP1 = ("eagle-draft-tp1",)
#: ... and a dense ``draft_model`` draft (``kimi_tli`` included).
DRAFT_MODEL_TP1 = (*DRAFT_TP1, "draft-model-tp1")
#: Slugs of git patches withdrawn from the series -> the runtime patch that carries the
#: change now (``upstream-notes/README.md`` says why each was withdrawn).
WITHDRAWN = {
    "replicate-draft-embedding": "R08",
    "kimi-k25-mtp": "R10",
    "kimi-mtp-deepseek-dir": "R11",
}
#: ``{patch:SLUG}`` / ``{patch:SLUG,SLUG,...}`` in profile text.
PLACEHOLDER = re.compile(r"\{patch:([a-z0-9,-]+)\}")


@functools.cache
def numbers() -> dict[str, str]:
    """Slug -> four-digit number of every patch of the shipped series, in series order."""
    return slug_numbers(compat.expected_record()["series"])


def slug_numbers(series: list) -> dict[str, str]:
    """Slug -> number of each ``series`` entry of a record; a one-line error on a missing,
    malformed or repeated slug, or on one that :data:`WITHDRAWN` names too."""
    out: dict[str, str] = {}
    for entry in series:
        entry = entry if isinstance(entry, dict) else {}
        slug, name = entry.get("slug"), str(entry.get("name"))
        if (not (isinstance(slug, str) and SLUG_RE.fullmatch(slug)) or slug in out
                or slug in WITHDRAWN):
            raise PatchSetError(
                f"vllm_kimi_ext/series.json: patch {name}: field 'slug': expected a unique "
                f"name of lowercase words and hyphens (not a withdrawn patch's), found "
                f"{slug!r}; regenerate it with `nox -s apply-patches -- --export`")
        out[slug] = name[:4]
    return out


def number(slug: str) -> str:
    """The four-digit number of the patch ``slug`` in the shipped series, or ``RNN`` for
    a withdrawn one."""
    if slug in WITHDRAWN:
        return WITHDRAWN[slug]
    try:
        return numbers()[slug]
    except KeyError:
        raise PatchSetError(f"unknown patch slug {slug!r}; the series has: "
                            f"{', '.join(numbers())}; withdrawn: "
                            f"{', '.join(WITHDRAWN)}") from None


def ref(*slugs: str) -> str:
    """``patch NNNN`` for one slug, ``patches NNNN/NNNN`` for several (series order);
    withdrawn slugs as ``runtime patch RNN`` (``runtime patches RNN/RNN``), after them."""
    if not slugs:
        raise ValueError("ref() needs at least one slug")
    found = sorted({number(s) for s in slugs})
    parts = []
    for kind, nums in (("patch", [n for n in found if n.isdigit()]),
                       ("runtime patch", [n for n in found if not n.isdigit()])):
        if nums:
            parts.append(f"{kind} {nums[0]}" if len(nums) == 1
                         else f"{kind}es {'/'.join(nums)}")
    return " and ".join(parts)


def render(text: str) -> str:
    """``text`` with every ``{patch:...}`` placeholder replaced by :func:`ref`."""
    return PLACEHOLDER.sub(lambda m: ref(*m.group(1).split(",")), text)

"""Git patches named by slug; their numbers are rendered from the shipped series.

Patch numbers change whenever the series is regenerated (a patch split, inserted or
reordered), so nothing in the package writes one down: code, cost-model profiles and the
generated docs name a patch by its slug (``replicate-draft-embedding``), and the number
comes from ``vllm_kimi_ext/series.json`` (written by ``nox -s apply-patches -- --export``,
which keeps each patch's slug). ``tests/unit/test_series_slugs.py`` fails on a literal patch
number in the package or in generated docs.

Profiles and other text write ``{patch:SLUG}`` or ``{patch:SLUG,SLUG}``; :func:`render`
turns it into ``patch NNNN`` / ``patches NNNN/NNNN``.
"""

from __future__ import annotations

import functools
import re

from vllm_kimi_ext import compat
from vllm_kimi_ext.patchset import SLUG_RE, PatchSetError

#: The patches a draft needs to run at ``draft_tensor_parallel_size: 1``: the EAGLE family...
DRAFT_TP1 = ("unsharded-tp-group", "draft-tp-refusal", "eagle-draft-tp1")
#: ... and a dense ``draft_model`` draft (``kimi_tli`` included).
DRAFT_MODEL_TP1 = (*DRAFT_TP1, "draft-model-tp1")
#: ``{patch:SLUG}`` / ``{patch:SLUG,SLUG,...}`` in profile text.
PLACEHOLDER = re.compile(r"\{patch:([a-z0-9,-]+)\}")


@functools.cache
def numbers() -> dict[str, str]:
    """Slug -> four-digit number of every patch of the shipped series, in series order."""
    out: dict[str, str] = {}
    for entry in compat.expected_record()["series"]:
        slug, name = entry.get("slug"), str(entry.get("name"))
        if not (isinstance(slug, str) and SLUG_RE.fullmatch(slug)) or slug in out:
            raise PatchSetError(
                f"vllm_kimi_ext/series.json: patch {name}: field 'slug': expected a unique "
                f"name of lowercase words and hyphens, found {slug!r}; regenerate it with "
                "`nox -s apply-patches -- --export`")
        out[slug] = name[:4]
    return out


def number(slug: str) -> str:
    """The four-digit number of the patch ``slug`` in the shipped series."""
    try:
        return numbers()[slug]
    except KeyError:
        raise PatchSetError(f"unknown patch slug {slug!r}; the series has: "
                            f"{', '.join(numbers())}") from None


def ref(*slugs: str) -> str:
    """``patch NNNN`` for one slug, ``patches NNNN/NNNN`` for several (series order)."""
    if not slugs:
        raise ValueError("ref() needs at least one slug")
    nums = sorted(number(s) for s in slugs)
    return f"patch {nums[0]}" if len(nums) == 1 else f"patches {'/'.join(nums)}"


def render(text: str) -> str:
    """``text`` with every ``{patch:...}`` placeholder replaced by :func:`ref`."""
    return PLACEHOLDER.sub(lambda m: ref(*m.group(1).split(",")), text)

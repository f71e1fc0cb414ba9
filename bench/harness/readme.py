"""The README section "What to run on 8x PCIe", regenerated from the cost model's headline.

The section's text is :func:`vllm_kimi_ext.costmodel.answer_text.readme_section` (the same
function feeds ``docs/what-to-run.md`` and ``nox -s bench``); this module is only the
doc-generator front end with the project's convention: ``python -m bench.harness.readme
--write-docs .`` rewrites the section of ``./README.md`` in place, ``--check-docs .`` exits 1
when it is stale. The directory is the one that holds README.md: the repository root.
"""

from __future__ import annotations

import sys

from bench.harness.generated_docs import in_place_main
from vllm_kimi_ext.costmodel.answer_text import updated_readme


def main(argv: list[str] | None = None) -> int:
    return in_place_main("python -m bench.harness.readme", __doc__.split("\n\n")[0],
                         "README.md", lambda text, where: updated_readme(text), argv)


if __name__ == "__main__":
    sys.exit(main())

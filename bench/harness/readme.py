"""The README section "What to run on 8x PCIe", regenerated from the cost model's headline.

The section's text is :func:`vllm_kimi_ext.costmodel.headline.readme_section` (the same
function feeds ``docs/what-to-run.md`` and ``nox -s bench``); this module is only the
doc-generator front end with the project's convention: ``python -m bench.harness.readme
--write-docs .`` rewrites the section of ``./README.md`` in place, ``--check-docs .`` exits 1
when it is stale. The directory is the one that holds README.md: the repository root.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_kimi_ext.costmodel.headline import updated_readme


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.harness.readme",
                                 description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write-docs", type=Path, metavar="DIR",
                   help="update the section in DIR/README.md")
    g.add_argument("--check-docs", type=Path, metavar="DIR",
                   help="exit 1 if DIR/README.md's section is stale")
    args = ap.parse_args(argv)
    root = args.write_docs or args.check_docs
    readme_path = root / "README.md"
    try:
        readme = readme_path.read_text()
        new = updated_readme(readme)
    except OSError as exc:
        print(f"{exc.filename}: cannot read ({exc.strerror})", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"{readme_path}: {exc}", file=sys.stderr)
        return 2
    if args.check_docs:
        if new != readme:
            print(f"stale: {readme_path} (run python -m bench.harness.readme --write-docs "
                  f"{root})", file=sys.stderr)
            return 1
        return 0
    if new != readme:
        readme_path.write_text(new)
        print(f"wrote {readme_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

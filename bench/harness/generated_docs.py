"""Every generated document of the repository and the generator that writes it.

One convention: a generator is a module whose command line takes ``--write-docs DIR`` (write
its documents under DIR, or update their generated parts in place; files already up to date
are left alone) and ``--check-docs DIR`` (exit 1 when one is stale). ``nox -s docs`` runs
:data:`GENERATORS` in order (the README section is made from ``docs/what-to-run.md``, so it
comes after the cost model); ``tests/unit/test_generated_docs.py`` regenerates everything
into a scratch tree with :func:`stale_documents` and fails when a committed document differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import shutil
import sys
from collections.abc import Callable
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class DocGenerator:
    #: ``python -m MODULE --write-docs DIR``
    module: str
    #: DIR, relative to the repository root
    directory: str
    #: the documents it writes, relative to DIR
    documents: tuple[str, ...]
    #: those of them it edits in place (hand-written around generated blocks)
    updates: tuple[str, ...] = ()

    def command(self, root: Path, check: bool = False) -> list[str]:
        """Arguments after ``python``."""
        return ["-m", self.module, "--check-docs" if check else "--write-docs",
                str(root / self.directory)]


GENERATORS: tuple[DocGenerator, ...] = (
    # first: it copies the measured verify report into the package, which the cost-model
    # documents after it price (the verify block of docs/cost-model.md: three verifiers)
    DocGenerator("vllm_kimi_ext.costmodel.verify_report", "docs", ("cost-model.md",),
                 updates=("cost-model.md",)),
    DocGenerator("vllm_kimi_ext.costmodel.report", "docs",
                 ("what-to-run.md", "cost-model.md", "choosing-a-draft.md"),
                 updates=("cost-model.md", "choosing-a-draft.md")),
    DocGenerator("vllm_kimi_ext.costmodel.placement_table", "docs", ("collectives-per-token.md",)),
    # the histogram escalation's price table (test kit: that escalation is not shipped)
    DocGenerator("testkit.verify_hist_prices", "docs", ("sharded-verification.md",),
                 updates=("sharded-verification.md",)),
    DocGenerator("vllm_kimi_ext.drafts.doctor.codes", "docs", ("doctor.md",),
                 updates=("doctor.md",)),
    DocGenerator("bench.harness.readme", ".", ("README.md",), updates=("README.md",)),
    DocGenerator("bench.harness.bill_example", "docs", ("training-a-draft.md",),
                 updates=("training-a-draft.md",)),
    # the small-scale run's tables, from its committed results.json
    DocGenerator("bench.harness.smallscale_docs", "docs", ("training-a-draft.md",),
                 updates=("training-a-draft.md",)),
)


def documents() -> list[str]:
    """Every generated document, relative to the repository root (once each, although
    several generators may update one)."""
    return list(dict.fromkeys(str(Path(g.directory) / d) for g in GENERATORS
                              for d in g.documents))


def regenerate(root: Path, scratch: Path) -> list[str]:
    """Write every generated document of the tree at ``root`` afresh under ``scratch``: the
    documents edited in place are copied from ``root`` first, then each generator runs
    (in process) with ``--write-docs``. Returns the documents, relative to either tree."""
    for g in GENERATORS:
        for name in g.updates:
            dst = scratch / g.directory / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / g.directory / name, dst)
    for g in GENERATORS:
        rc = importlib.import_module(g.module).main(g.command(scratch)[2:])
        if rc != 0:
            raise RuntimeError(f"python {' '.join(g.command(scratch))} exited {rc}")
    return documents()


def stale_documents(root: Path, scratch: Path) -> list[str]:
    """The generated documents of ``root`` that differ from a fresh regeneration (missing
    ones included), relative to ``root``."""
    stale = []
    for rel in regenerate(root, scratch):
        mine = root / rel
        if not mine.is_file() or mine.read_text() != (scratch / rel).read_text():
            stale.append(rel)
    return stale


def in_place_main(prog: str, description: str, document: str, update: Callable[[str, str], str],
                  argv: list[str] | None = None) -> int:
    """The convention's command line for a generator that edits ``DIR/document`` in place:
    ``update(text, path)`` returns the document with its generated parts current (ValueError
    when it lacks them). Exit 0 written / up to date, 1 stale (``--check-docs``), 2 unreadable
    or without its generated parts (one line on stderr)."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write-docs", type=Path, metavar="DIR",
                   help=f"update the generated parts of DIR/{document}")
    g.add_argument("--check-docs", type=Path, metavar="DIR",
                   help=f"exit 1 if DIR/{document}'s generated parts are stale")
    args = ap.parse_args(argv)
    root = args.write_docs or args.check_docs
    path = root / document
    try:
        text = path.read_text()
        new = update(text, str(path))
    except OSError as exc:
        print(f"{exc.filename}: cannot read ({exc.strerror})", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 2
    if args.check_docs:
        if new != text:
            print(f"stale: {path} (run python -m {prog.split()[-1]} --write-docs {root})",
                  file=sys.stderr)
            return 1
        return 0
    if new != text:
        path.write_text(new)
        print(f"wrote {path}")
    return 0

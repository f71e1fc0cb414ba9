"""The ``draft bill`` numbers of ``docs/training-a-draft.md``, produced by the tool itself.

Two generated blocks of that document: ``bill`` (the example command and what it prints)
and ``bill-payback`` (the fine-tune-or-switch sentence, with the box-hours and payback hours
of the same command and of the smaller pilot). Both run ``vllm-kimi-ext draft bill``
in-process, so a change to the bill or to the cost model behind it makes the committed
document stale (``tests/unit/test_generated_docs.py``). Doc-generator convention:
``python -m bench.harness.bill_example --write-docs docs/`` rewrites the blocks in place,
``--check-docs docs/`` exits 1 when one is stale.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from bench.harness.generated_docs import in_place_main

DOC = "training-a-draft.md"
PROG = "python -m bench.harness.bill_example"
#: The documented example: 300k prompts (one lightseek phase), tau 1.6 today, 2.69 expected
#: after fine-tuning, 1.75 for the other public draft.
EXAMPLE = ("draft", "bill", "--prompts", "300000", "--tau-now", "1.6", "--tau-after", "2.69",
           "--tau-alt", "1.75")
#: The smaller pilot of the payback sentence.
PILOT = ("draft", "bill", "--prompts", "20000", "--tau-now", "1.6", "--tau-after", "2.0")


def _run(argv: tuple[str, ...]) -> str:
    """What ``vllm-kimi-ext ARGV`` prints (it must succeed)."""
    from vllm_kimi_ext.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    if code != 0:
        raise RuntimeError(f"vllm-kimi-ext {' '.join(argv)} exited {code}: {err.getvalue()}")
    return out.getvalue()


def blocks() -> dict[str, str]:
    """{block name: generated text}."""
    example = _run(EXAMPLE).rstrip("\n")
    big = json.loads(_run((*EXAMPLE, "--json")))
    pilot = json.loads(_run((*PILOT, "--json")))
    cmp, pcmp = big["compare"], pilot["compare"]
    payback = (
        "**When fine-tuning beats switching.** Switching to another public draft costs nothing "
        "but gives its τ on your traffic at its step time; fine-tuning costs the box hours "
        "above and keeps today's step time. With τ 1.6 today, 1.75 for the alternative and "
        "2.69 expected after fine-tuning, fine-tuning "
        + ("wins" if cmp["fine_tune_wins"] else "does not win")
        + f" in steady state and pays back its {big['bill']['box_hours']:.0f} box-hours after "
        f"~{cmp['payback_hours_vs_switch']:.0f} serving hours relative to switching; with a "
        "smaller pilot (20k prompts, expected τ 2.0) the box is busy "
        f"{pilot['bill']['box_hours']:.0f} hours and pays back in "
        f"~{pcmp['payback_hours_vs_today']:.0f} serving hours (`--prompts 20000 --tau-after "
        "2.0`).")
    return {"bill": f"```\n$ vllm-kimi-ext {' '.join(EXAMPLE)}\n{example}\n```",
            "bill-payback": payback}


def replace_blocks(text: str, new: dict[str, str], prog: str) -> str:
    """``text`` with each generated block ``name`` (between its markers, which name
    ``prog``) replaced by ``new[name]``; ValueError when a block's markers are missing."""
    for name, block in new.items():
        begin = f"<!-- BEGIN GENERATED: {name} ({prog} --write-docs docs/) -->"
        end = f"<!-- END GENERATED: {name} -->"
        if begin not in text or end not in text:
            raise ValueError(f"lacks the GENERATED {name} markers")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{block}\n{end}{tail}"
    return text


def updated(text: str, where: str) -> str:
    return replace_blocks(text, blocks(), PROG)


def main(argv: list[str] | None = None) -> int:
    return in_place_main(PROG, __doc__.split("\n\n")[0], DOC, updated, argv)


if __name__ == "__main__":
    sys.exit(main())

"""Every command README.md and docs/*.md print runs as printed.

Each shell block (```bash / ```sh, indented ones in lists too) and each inline code span that
is a complete project command (``vllm-kimi-ext ...``, ``python bench/...``, ``python -m
vllm_kimi_ext...`` with at least one option and no placeholder) becomes one test case:

* **run** on CPU, in process, exactly as printed, in a scratch directory: ``/models/NAME`` is
  a scratch folder whose fixture is written first (:data:`MODELS`: a tiny Kimi-K2.5-shaped
  target with a Kimi-format tokenizer, a DFlash-shaped draft written by the
  ``huggingface-cli download`` line that precedes it, a small-vocabulary draft tokenizer);
  ``bench/out/`` lies in the scratch directory; a python given to ``bench/e2e/runner.py``
  (``.venv``, ``/path/to/venv``) is the project's stand-in server
  (``bench/harness/fake_server.py``); an ``--acceptance-from`` file the docs expect from an
  earlier run is written in that run's format. It must exit 0.
* **skip**, with the reason of the first matching :data:`SKIP` rule, what cannot run here
  (the real Kimi-K2.5 on 8 GPUs, the model hub, the package index, GPU training stages);
  a skipped ``vllm-kimi-ext`` command is still parsed by the command's own parser, and a
  skipped ``vllm serve`` line must carry a ``--speculative-config`` that is valid JSON with a
  method and a model.

A ``/models`` path with no fixture and no skip rule fails the case: a new printed command
needs one or the other. The first serve example in README.md must be the answer's.

Planted bug this was written against: README's quickstart printing ``plan --lst``-style
typos, e.g. docs/cost-model.md's ``vllm-kimi-ext plan --list`` edited to
``vllm-kimi-ext plan --lst`` -> ``test_printed_command_runs[docs/cost-model.md:...]`` fails
(exit 2: unrecognized arguments).
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.harness import fake_server

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
FENCE = re.compile(r"^(?P<ind>[ \t]*)```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^(?P=ind)```",
                   re.S | re.M)
INLINE = re.compile(r"(?<!`)`(?P<cmd>(?:vllm-kimi-ext|python bench/|python -m vllm_kimi_ext)"
                    r"[^`\n]*)`(?!`)")
#: A word that marks a template, not a command: NAME, DIR, T, <draft>, [--json], ...
PLACEHOLDER = re.compile(r"(^|[\s=/])(?:(?!TRITON_)[A-Z][A-Z_]*|\.\.\.|<[^>]*>|\[[^\]]*\])"
                         r"(?=$|[\s,/.])")

#: (pattern of the command, why it cannot run here). First match wins.
SKIP = (
    (r"(<[^>]*>|\[--[^\]]*\])",
     "a template (placeholders such as <draft> or [--json]), not a command to run as is"),
    (r"^pip (install|download)\b",
     "installs from the package index (no network at test time; CI installs through the "
     "noxfile's sessions)"),
    (r"^nox -s apply-patches\b",
     "rebuilds vLLM 0.34.0 from its sdist into the project environment (minutes, network; "
     "CI's first stage runs it)"),
    (r"^nox( -s test)?$", "the CPU test tier itself (this test is part of it)"),
    (r"^(source|export) ", "sets the shell environment only"),
    (r"^(\w+=\S+ )*vllm serve\b",
     "serves the real Kimi-K2.5 (1T parameters) on 8 GPUs; its --speculative-config is "
     "checked as JSON"),
    (r"^huggingface-cli download\b",
     "downloads from the model hub (none at test time); the test writes the fixture the "
     "next commands read"),
    (r"^vllm-kimi-ext draft (regenerate|capture|train|eval) ",
     "a training stage against the real target (a vLLM server, GPUs, the real checkpoint); "
     "tests/unit/test_train_*.py and bench/train_smallscale.py run the stages on tiny "
     "models"),
    (r"^vllm-kimi-ext draft shrink-vocab ",
     "needs the real head and corpus files (sharegpt.jsonl, ...); tests/unit/"
     "test_shrink_vocab.py runs it on a tiny head"),
    (r"^vllm-kimi-ext doctor .*/models/kimi-k2\.5-eagle3-",
     "reads a head this guide's previous (skipped) command writes; doctor runs on the tiny "
     "target above"),
    (r"^python -m vllm_kimi_ext\.costmodel\.calibration --update-profile",
     "refits and rewrites the shipped hardware profile (a maintainer's step; needs scipy)"),
)

#: The scratch checkpoints a printed ``/models/NAME`` stands for.
MODELS = {
    "Kimi-K2.5": "target",
    "small-lm": "draft-tokenizer",
    "small-draft": "draft-tokenizer",
    "Kimi-K2.5-DFlash": "dflash",  # written by the huggingface-cli line that precedes it
}


@dataclass(frozen=True)
class Printed:
    doc: str
    line: int
    text: str
    inline: bool = False

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _logical_lines(body: str) -> list[tuple[int, str]]:
    """(offset, command) of a shell block: continuations joined, a quoted string spanning
    lines kept whole, comments dropped."""
    out, buf, start = [], "", 0
    for i, raw in enumerate(body.splitlines()):
        line = raw.rstrip()
        if not buf:
            start = i
            if not line.strip() or line.strip().startswith("#"):
                continue
        buf += ("\n" if buf and not buf.endswith(" ") else "") + line
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        try:
            shlex.split(buf, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        out.append((start, buf.strip()))
        buf = ""
    assert not buf, f"unterminated command: {buf!r}"
    return out


def printed_commands(unique: bool = True) -> list[Printed]:
    """Every printed command, in document order; with ``unique``, once (the first place it
    is printed)."""
    out: list[Printed] = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for m in FENCE.finditer(text):
            if m["lang"] not in ("bash", "sh", "shell"):
                continue
            first = text.count("\n", 0, m.start("body")) + 1
            body = "\n".join(ln[len(m["ind"]):] if ln.startswith(m["ind"]) else ln
                             for ln in m["body"].splitlines())
            out += [Printed(doc, first + off, cmd) for off, cmd in _logical_lines(body)]
        for m in INLINE.finditer(text):
            cmd = m["cmd"].strip()
            if " --" in cmd and not PLACEHOLDER.search(cmd):
                out.append(Printed(doc, text.count("\n", 0, m.start()) + 1, cmd, inline=True))
    if not unique:
        return out
    seen: set[str] = set()
    once = []
    for p in out:
        key = " ".join(shlex.split(p.text, comments=True))
        if key not in seen:
            seen.add(key)
            once.append(p)
    return once


COMMANDS = printed_commands()
EVERY = printed_commands(unique=False)


def skip_reason(cmd: str) -> str | None:
    words = " ".join(shlex.split(cmd, comments=True))
    for pattern, why in SKIP:
        if re.search(pattern, words):
            return why
    return None


# ---------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------


def _write_model(kind: str, path: Path) -> None:
    from testkit.checkpoints import TinyKimiSpec, write_tiny_kimi_k25
    from testkit.tokenizers import write_kimi_tokenizer
    from tests.unit.test_draft_rope_config import dflash_config, write_draft

    if kind == "target":
        write_tiny_kimi_k25(path, TinyKimiSpec(num_hidden_layers=6))
        write_kimi_tokenizer(path, n_ranks=1024)
    elif kind == "draft-tokenizer":
        write_kimi_tokenizer(path, n_ranks=512)
    elif kind == "dflash":
        write_draft(path, dflash_config())
    else:
        raise AssertionError(kind)


@pytest.fixture()
def fake_python(tmp_path):
    """A 'python' whose ``-m vllm.entrypoints...`` runs the stand-in server."""
    script = tmp_path / "fakepy"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-m" ]; then shift 2; exec "{sys.executable}" "{fake_server.__file__}" '
        '"$@"; fi\n'
        f'exec "{sys.executable}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def _results_for_every_draft(path: Path) -> None:
    """A results.json in bench/e2e/runner.py's format with one run per shipped draft."""
    from vllm_kimi_ext.costmodel.catalog import list_profiles, load_draft

    runs = []
    for name in list_profiles("drafts"):
        d = load_draft(name)
        runs.append({"id": f"speculative={name}", "axes": {"speculative": name},
                     "status": "ok",
                     "speculative_config": {"method": d.method, "model": d.checkpoint},
                     "levels": [{"concurrency": 1, "acceptance": {
                         "per_position": [0.7, 0.5, 0.35, 0.25, 0.2, 0.15, 0.1],
                         "num_drafts": 100}}]})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": "vllm-kimi-ext/e2e-results/1", "runs": runs}))


#: Flags whose /models value the command writes (no fixture needed).
OUTPUT_FLAGS = ("--out", "--local-dir")


def _localize(argv: list[str], tmp: Path, python: str) -> list[str]:
    """The printed arguments with /models, bench/out and the box's python in the scratch
    directory; model fixtures written on first use."""
    out = []
    for i, a in enumerate(argv):
        writes = i > 0 and argv[i - 1] in OUTPUT_FLAGS
        for m in re.finditer(r"/models/([\w.-]+)", a):
            local = tmp / "models" / m[1]
            if local.exists() or writes:
                continue
            if m[1] not in MODELS or MODELS[m[1]] == "dflash":
                pytest.fail(f"/models/{m[1]}: no fixture (MODELS) and no SKIP rule for this "
                            "command, and no earlier printed line writes it")
            _write_model(MODELS[m[1]], local)
        a = a.replace("/models/", f"{tmp}/models/")
        a = re.sub(r"^bench/out/", f"{tmp}/bench/out/", a)
        out.append(a)
    out = [python if a in (".venv", "/path/to/venv") else a for a in out]
    for flag, value in zip(out, out[1:]):
        if flag == "--acceptance-from" and not Path(value).exists():
            _results_for_every_draft(Path(value))
        if flag == "--latency" and not Path(value).exists() and value.endswith(".json"):
            shutil.copyfile(ROOT / "vllm_kimi_ext" / "costmodel" / "profiles" / "latency"
                            / "rtx-pro-6000-pcie-x8.json", value)
    return out


def _check_serve(cmd: str) -> None:
    argv = shlex.split(cmd, comments=True)
    if "--speculative-config" in argv:
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec.get("method") and (spec.get("model") or spec["method"] == "mtp"), spec


def _check_parses(argv: list[str]) -> None:
    """A skipped project command still parses under its own parser."""
    from vllm_kimi_ext.cli import build_parser

    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"{' '.join(argv)}: does not parse (exit {exc.code})")


def run_printed(cmd: str, tmp: Path, python: str, monkeypatch) -> int:
    argv = shlex.split(cmd, comments=True)
    env = {}
    while argv and re.fullmatch(r"\w+=.*", argv[0]):
        k, v = argv.pop(0).split("=", 1)
        env[k] = v
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp)
    argv = _localize(argv, tmp, python)
    if argv[0] == "vllm-kimi-ext":
        from vllm_kimi_ext.cli import main

        return main(argv[1:])
    if argv[0] == "python" and argv[1] == "-m":
        return importlib.import_module(argv[2]).main(argv[3:])
    if argv[0] == "python" and argv[1].startswith("bench/"):
        from bench.harness import e2e
        from bench.harness.e2e import run as e2e_run

        # the stand-in's numbers mean nothing: settle less, send 2 short requests per level
        monkeypatch.setattr(e2e_run, "SETTLE_S", 0.05)
        load = e2e.load_config
        monkeypatch.setattr(e2e, "load_config", lambda *a, **k: {
            **load(*a, **k), "requests_per_level": 2, "max_tokens": 16})
        script = argv[1].removesuffix(".py").replace("/", ".")
        return importlib.import_module(script).main(argv[2:])
    raise AssertionError(f"no way to run {cmd!r}: add a SKIP rule with its reason")


def _prepare(doc_cmds: list[Printed], upto: Printed, tmp: Path, python: str,
             monkeypatch) -> None:
    """What the earlier lines of the same shell block wrote: a skipped download becomes its
    fixture, a command that writes a /models directory is run first."""
    for p in doc_cmds:
        if (p.line, p.text) == (upto.line, upto.text):
            break
        if p.text.startswith("huggingface-cli download"):
            argv = shlex.split(p.text, comments=True)
            local = Path(argv[argv.index("--local-dir") + 1].replace("/models/",
                                                                     f"{tmp}/models/"))
            if MODELS.get(local.name) and not local.exists():
                _write_model(MODELS[local.name], local)
            continue
        m = re.search(r"--out (/models/[\w.-]+)", p.text)
        if m and m[1] in upto.text and not Path(m[1].replace("/models/", f"{tmp}/models/")
                                                 ).exists():
            assert run_printed(p.text, tmp, python, monkeypatch) == 0, p.id


# ---------------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------------


def test_commands_were_found():
    docs = {p.doc for p in COMMANDS}
    assert "README.md" in docs and "docs/what-to-run.md" in docs and len(COMMANDS) > 30
    assert any(p.inline and "runner.py recommendation" in p.text for p in COMMANDS)


@pytest.mark.parametrize("printed", COMMANDS, ids=lambda p: p.id)
def test_printed_command_runs(printed, tmp_path, fake_python, monkeypatch, capsys):
    cmd = printed.text
    why = skip_reason(cmd)
    if why is not None:
        if "vllm serve" in cmd:
            _check_serve(cmd)
        elif cmd.startswith("vllm-kimi-ext ") and why != SKIP[0][1]:  # not a template
            _check_parses(shlex.split(cmd, comments=True))
        pytest.skip(why)
    _prepare([p for p in EVERY if p.doc == printed.doc], printed, tmp_path, fake_python,
             monkeypatch)
    rc = run_printed(cmd, tmp_path, fake_python, monkeypatch)
    out, err = capsys.readouterr()
    assert rc == 0, f"{printed.id}: `{cmd}` exited {rc}: {err.strip()[-600:]}"


def test_readmes_first_serve_example_is_the_answer():
    from vllm_kimi_ext.costmodel.headline import headline, serve_command

    h = headline()
    first = next(p for p in COMMANDS if p.doc == "README.md" and "vllm serve" in p.text)
    want = " ".join(serve_command(h.plan, h.choice.option.requires).replace("\\\n", " ")
                    .split())
    assert " ".join(first.text.split()) == want, first.text

"""Mutation testing of verify/ (the graph step and its escalation), drafts/, train/ and
patchset.py with cosmic-ray.

``nox -s mutants`` runs this in its own environment (cosmic-ray installed there);
each mutant's tests run in the project environment. Per package: cosmic-ray lists
every mutant of the package's modules, a deterministic sample of ``--sample`` of
them (the lowest sha256 of seed, module, operator and occurrence) is kept and the
rest marked skipped, then each kept mutant is applied to a scratch copy of the
repository (never to your checkout) and the package's tests run against it: a
failing run kills the mutant, a passing one lets it survive.

The session database under ``--work`` keeps results, so an interrupted run (time
limit, Ctrl-C) resumes where it stopped. The report (``mutants.json`` and
``mutants.md`` in ``--out``) gives caught/total per package, the exact test command
and sample, and every surviving mutant with its diff and, where
``survivors.json`` in ``--out`` explains it, why it is acceptable.

    nox -s mutants                                   # 12 mutants per package
    nox -s mutants -- --packages patchset --sample 30
    nox -s mutants -- --sample 0                     # every mutant (hours on 2 cores)
    nox -s mutants -- --minutes 30 --report-only
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}


@dataclasses.dataclass(frozen=True)
class Package:
    paths: tuple[str, ...]
    tests: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    pytest_args: tuple[str, ...] = ()
    timeout_s: float = 300.0


#: The fast tests that exercise each package (the CPU tier's unit and vLLM tests of
#: it, without the slow interpreter and distribution runs; those stay in `nox -s test`).
PACKAGES: dict[str, Package] = {
    "verify": Package(
        paths=("vllm_kimi_ext/verify",),
        # The Triton kernels: GPU / Triton-interpreter only, no per-mutant CPU test runs them
        # (the split escalation's kernels have their own package below, with the
        # interpreter test)
        exclude=tuple(f"vllm_kimi_ext/verify/_kernels/{m}.py" for m in (
            "__init__", "common", "stats", "merge", "decide", "escalate_rows", "escalate_split",
            "escalate_folded")),
        tests=("tests/unit/test_mutants_verify.py", "tests/unit/test_verify_plan.py",
               "tests/unit/test_verify_graph_step.py", "tests/unit/test_verify_step_graphs.py",
               "tests/unit/test_verify_escalation_pins.py", "tests/unit/test_verify_hashing.py",
               "tests/unit/test_sharded_verify_runner_glue.py",
               "tests/unit/test_verify_equivalence.py", "tests/unit/test_verify_kernels.py",
               "tests/unit/test_verify_top_p.py", "tests/vllm/test_planted_gates.py"),
        pytest_args=("-k", "not interpreter and not follow_the_nucleus and not chi_square"),
        timeout_s=600.0),
    # The split bf16 escalation (its Triton kernels run by Triton's CPU interpreter: about
    # 4 minutes per mutant on a shared 2-core machine).
    "verify_escalation": Package(
        paths=("vllm_kimi_ext/verify/_kernels/escalate_split.py",),
        tests=("tests/unit/test_verify_escalation_interpreter.py",),
        timeout_s=1200.0),
    # The per-step choice between the sharded verifier and vLLM's batch-sharded sampling.
    "verifier_choice": Package(
        paths=("vllm_kimi_ext/integration/verifier_choice.py",),
        tests=("tests/unit/test_verifier_choice.py", "tests/vllm/test_runtime_patches.py"),
        pytest_args=("-k", "verifier_choice or batch_sharder")),
    "drafts": Package(
        paths=("vllm_kimi_ext/drafts",),
        exclude=("vllm_kimi_ext/drafts/tli/_triton.py",),  # GPU only
        tests=("tests/unit/test_mutants_drafts.py", "tests/unit/test_planted_doctor.py",
               "tests/unit/test_drafts_doctor.py",
               "tests/unit/test_tli_maps.py", "tests/unit/test_draft_placement_table.py",
               "tests/unit/test_cross_tokenizer.py", "tests/unit/test_shrink_vocab.py",
               "tests/unit/test_draft_rope_config.py")),
    "train": Package(
        paths=("vllm_kimi_ext/train",),
        tests=("tests/unit/test_mutants_train.py", "tests/unit/test_planted_bill.py",
               "tests/unit/test_train_bill.py",
               "tests/unit/test_train_data.py", "tests/vllm/test_planted_train.py",
               "tests/unit/test_bad_input_train.py"),
        timeout_s=600.0),
    "patchset": Package(
        paths=("vllm_kimi_ext/patchset.py",),
        tests=("tests/unit/test_mutants_patchset.py", "tests/unit/test_patchset.py",
               "tests/unit/test_planted_checks.py"),
        pytest_args=("-k", "not rank and not verification_bytes")),
}


def _existing(names) -> list[str]:
    return [n for n in names if (ROOT / n).exists()]


def test_command(pkg: Package, python: str) -> str:
    return shlex.join([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                       "-m", "not slow", *_existing(pkg.tests), *pkg.pytest_args])


def baseline(pkg: Package, tree: Path, env: dict, python: str) -> float:
    """Run the package's tests on the unmutated copy; seconds taken. A failing
    baseline would count every mutant as caught: stop instead."""
    t0 = time.monotonic()
    proc = subprocess.run(shlex.split(test_command(pkg, python)), cwd=tree, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise SystemExit(f"mutants: the tests fail without a mutant ({test_command(pkg, python)}"
                         f"):\n{tail}")
    return time.monotonic() - t0


def refresh_tree(tree: Path) -> None:
    """``tree`` = the files git tracks or would track in the checkout, as they are now."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    if tree.exists():
        shutil.rmtree(tree)
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not rel.startswith("build/"):
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / rel)


def write_config(path: Path, pkg: Package, python: str) -> None:
    lines = ["[cosmic-ray]",
             f"module-path = {json.dumps(list(pkg.paths))}",
             f"excluded-modules = {json.dumps(list(pkg.exclude))}",
             f"timeout = {pkg.timeout_s}",
             f"test-command = {json.dumps(test_command(pkg, python))}",
             "", "[cosmic-ray.distributor]", 'name = "local"', ""]
    path.write_text("\n".join(lines))


def mutant_key(seed: int, spec) -> str:
    return hashlib.sha256(f"{seed}:{Path(spec.module_path).as_posix()}:{spec.operator_name}:"
                          f"{spec.occurrence}".encode()).hexdigest()


def sample(db_path: Path, size: int, seed: int, tree: Path) -> tuple[int, int]:
    """Mark all but ``size`` mutants skipped (none when ``size`` is 0) and record which
    kept ones lie in a never-evaluated annotation of ``tree`` (``*.annotations.json``
    beside the database). Returns ``(kept, total)``."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(db_path), WorkDB.Mode.open) as db:
        items = list(db.work_items)
        done = {job_id for job_id, _ in db.results}
        ranked = sorted(items, key=lambda it: mutant_key(seed, it.mutations[0]))
        keep = ranked if size <= 0 else ranked[:size]
        keep_ids = {it.job_id for it in keep}
        skip = [it.job_id for it in items if it.job_id not in keep_ids and it.job_id not in done]
        if skip:
            db.set_multiple_results(skip, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    spans: dict = {}
    equivalent = [it.job_id for it in keep if in_annotation(it.mutations[0], tree, spans)]
    db_path.with_suffix(".annotations.json").write_text(json.dumps(equivalent))
    return len(keep), len(items)


def run_exec(config: Path, db: Path, tree: Path, deadline: float, env: dict) -> bool:
    """cosmic-ray exec until done or ``deadline``; True when it finished."""
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    proc = subprocess.Popen([sys.executable, "-m", "cosmic_ray.cli", "exec", str(config),
                             str(db)], cwd=tree, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=left) == 0
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return False


def annotation_spans(module: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Source spans of the type annotations Python never evaluates: every annotation
    of a module with ``from __future__ import annotations`` (PEP 563)."""
    import ast

    tree = ast.parse(module.read_text(encoding="utf-8"))
    postponed = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                    and any(a.name == "annotations" for a in n.names) for n in tree.body)
    if not postponed:
        return []
    nodes = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            nodes.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
            nodes.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            nodes.append(node.annotation)
    return [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in nodes]


def in_annotation(spec, root: Path, cache: dict) -> bool:
    """The mutation lies inside an annotation that is never evaluated (an equivalent
    mutant). cosmic-ray positions: 1-based lines, 0-based columns, as ``ast``'s."""
    module = root / spec.module_path
    if module not in cache:
        cache[module] = annotation_spans(module) if module.is_file() else []
    start, end = tuple(spec.start_pos), tuple(spec.end_pos)
    return any(a <= start and end <= b for a, b in cache[module])


def survivor_id(spec) -> str:
    return f"{Path(spec.module_path).as_posix()}:{spec.start_pos[0]}:{spec.operator_name}"


def collect(db_path: Path) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    with use_db(str(db_path), WorkDB.Mode.open) as db:
        items = {it.job_id: it for it in db.work_items}
        results = dict(db.results)
    recorded = db_path.with_suffix(".annotations.json")
    equivalent = set(json.loads(recorded.read_text())) if recorded.is_file() else None
    out = {"mutants": len(items), "run": 0, "killed": 0, "survived": [], "incompetent": 0,
           "pending": 0, "annotation": 0}
    spans: dict = {}
    for job_id, item in items.items():
        res = results.get(job_id)
        if res is None:
            out["pending"] += 1
            continue
        if res.worker_outcome == WorkerOutcome.SKIPPED:
            continue
        out["run"] += 1
        spec = item.mutations[0]
        in_ann = (job_id in equivalent if equivalent is not None  # recorded at sampling
                  else in_annotation(spec, ROOT, spans))  # older runs: today's source
        if res.test_outcome == TestOutcome.SURVIVED and in_ann:
            out["annotation"] += 1  # equivalent: never evaluated
        elif res.test_outcome == TestOutcome.SURVIVED:
            out["survived"].append({"id": survivor_id(spec), "module": str(spec.module_path),
                                    "line": spec.start_pos[0], "operator": spec.operator_name,
                                    "occurrence": spec.occurrence, "diff": res.diff or ""})
        elif res.test_outcome == TestOutcome.INCOMPETENT:
            out["incompetent"] += 1
        else:
            out["killed"] += 1
    out["pending"] = sum(1 for j in items if j not in results)
    out["survived"].sort(key=lambda s: (s["module"], s["line"], s["operator"]))
    return out


def ran_command(work: Path, name: str, python: str) -> str:
    """The test command the package's mutants ran with (its session config), else today's."""
    import tomllib

    config = work / f"{name}.toml"
    if config.is_file():
        command = tomllib.loads(config.read_text())["cosmic-ray"]["test-command"]
    else:
        command = test_command(PACKAGES[name], python)
    return shlex.join(["python", *shlex.split(command)[1:]])  # no machine path in the report


def write_report(out_dir: Path, runs: dict, args, python: str) -> None:
    notes_path = out_dir / "survivors.json"
    notes = json.loads(notes_path.read_text()) if notes_path.is_file() else {}
    report = {"tool": f"cosmic-ray {_version()}", "seed": args.seed, "sample": args.sample,
              "packages": {}}
    md = ["# Mutation testing (`nox -s mutants`)", "",
          f"cosmic-ray {_version()}; every mutant cosmic-ray's operators make in the "
          f"package's modules, a deterministic sample of {args.sample or 'all'} per package "
          f"(seed {args.seed}), each run against the package's fast tests in a scratch copy "
          "of the repository. A mutant is caught when a test fails (or times out).", "",
          "Surviving mutants inside a type annotation of a module with `from __future__ "
          "import annotations` are equivalent (the annotation is never evaluated): they are "
          "counted in their own column, not as caught. Every other survivor is listed "
          "below with why it is acceptable.", "",
          "| package | mutants | sampled and run | caught | equivalent (annotation) "
          "| other survivors | caught / (run - equivalent) |",
          "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in runs.items():
        pkg = PACKAGES[name]
        caught = r["killed"] + r["incompetent"]
        report["packages"][name] = {
            "paths": list(pkg.paths), "excluded": list(pkg.exclude),
            "test_command": ran_command(args.work, name, python),
            "mutants": r["mutants"], "run": r["run"], "pending": r["pending"],
            "caught": caught, "equivalent_annotation": r["annotation"], "survived": [
                {**s, "why_acceptable": notes.get(s["id"])} for s in r["survived"]]}
        md.append(f"| {name} | {r['mutants']} | {r['run']}"
                  + (f" ({r['pending']} pending)" if r["pending"] else "")
                  + f" | {caught} | {r['annotation']} | {len(r['survived'])} "
                  f"| {caught}/{r['run'] - r['annotation']} |")
    md += ["", "## What ran", ""]
    for name, p in report["packages"].items():
        md += [f"- **{name}** (`{'`, `'.join(p['paths'])}`"
               + (f", excluding `{'`, `'.join(p['excluded'])}`" if p["excluded"] else "")
               + f"): `{p['test_command']}`"]
    md += ["", "## Surviving mutants", ""]
    for name, p in report["packages"].items():
        for s in p["survived"]:
            md += [f"### {name}: `{s['id']}`", "",
                   f"Why acceptable: {s['why_acceptable'] or '**not yet explained**'}", "",
                   "```diff", s["diff"].strip(), "```", ""]
    if not any(p["survived"] for p in report["packages"].values()):
        md.append("None.")
    (out_dir / "mutants.json").write_text(json.dumps(report, indent=1) + "\n")
    (out_dir / "mutants.md").write_text("\n".join(md).rstrip() + "\n")


def _version() -> str:
    from importlib import metadata

    return metadata.version("cosmic-ray")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="nox -s mutants --", description=__doc__.split("\n")[0])
    ap.add_argument("--packages", nargs="+", choices=sorted(PACKAGES), default=list(PACKAGES))
    ap.add_argument("--sample", type=int, default=12,
                    help="mutants per package (0: all); deterministic for a --seed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=60.0,
                    help="stop starting mutants after this long; rerun to resume")
    ap.add_argument("--python", default=sys.executable,
                    help="the project environment's python (runs the tests)")
    ap.add_argument("--work", type=Path, default=ROOT / ".nox" / "mutants-work")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "reports" / "mutants")
    ap.add_argument("--fresh", action="store_true", help="forget earlier results")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    if args.sample < 0 or args.minutes <= 0:
        ap.error("--sample must be >= 0 and --minutes > 0")
    if args.fresh and args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.minutes * 60
    env = {**os.environ, **OFFLINE_ENV}
    runs = {}
    for name in args.packages:
        pkg, tree = PACKAGES[name], args.work / "tree"
        config, db = args.work / f"{name}.toml", args.work / f"{name}.sqlite"
        if not args.report_only:
            refresh_tree(tree)  # also undoes a mutant an interrupted run left applied
            write_config(config, pkg, args.python)
            if not db.exists():
                subprocess.run([sys.executable, "-m", "cosmic_ray.cli", "init", str(config),
                                str(db)], cwd=tree, check=True, env=env)
            kept, total = sample(db, args.sample, args.seed, tree)
            took = baseline(pkg, tree, env, args.python)
            print(f"mutants: {name}: {kept} of {total} mutants sampled; the tests pass "
                  f"unmutated in {took:.0f} s", flush=True)
            finished = run_exec(config, db, tree, deadline, env)
            refresh_tree(tree)
            if not finished:
                print(f"mutants: {name}: time limit reached; rerun to resume", flush=True)
        if db.exists():
            runs[name] = collect(db)
    write_report(args.out, runs, args, args.python)
    print((args.out / "mutants.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

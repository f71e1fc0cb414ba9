"""Argument parsing of the bench entry points (run_all, the e2e runner, the all-reduce bench)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from bench.harness import e2e

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_script(rel: str, name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / rel)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def run_all():
    return load_script("run_all.py", "bench_run_all")


@pytest.fixture(scope="module")
def runner():
    return load_script("e2e/runner.py", "bench_e2e_runner")


@pytest.fixture(scope="module")
def arbench():
    return load_script("allreduce_bench.py", "bench_allreduce")


def test_run_all_defaults(run_all):
    a = run_all.parse_args([])
    assert a.out == BENCH / "out" and a.only == [] and a.skip == [] and not a.quick


def test_run_all_only_skip_quick(run_all):
    a = run_all.parse_args(["--only", "costmodel,verify-cpu", "--only", "e2e", "--skip",
                            "allreduce", "--quick", "--out", "x", "--no-git"])
    assert a.only == ["costmodel", "verify-cpu", "e2e"]
    assert a.skip == ["allreduce"] and a.quick and a.no_git and a.out == Path("x")


def test_run_all_rejects_unknown_section(run_all, capsys):
    with pytest.raises(SystemExit):
        run_all.parse_args(["--only", "nope"])
    assert "unknown section" in capsys.readouterr().err


def test_runner_run_and_compare(runner):
    p = runner.build_parser()
    a = p.parse_args(["run", "--python", "stock=/opt/v", "--select", "speculative=none",
                      "--requests", "3", "--concurrency", "1,2", "--plan-only"])
    assert a.cmd == "run" and a.plan_only and a.requests == 3
    assert e2e.parse_pythons(a.python) == {"stock": "/opt/v"}
    assert a.config.name == "e2e-tiny.yaml"
    c = p.parse_args(["compare", "a.json", "b.json", "--out", "c.md"])
    assert c.cmd == "compare" and c.b == Path("b.json") and c.out == Path("c.md")
    c1 = p.parse_args(["compare", "a.json", "--axis", "env=stock:patched"])
    assert c1.b is None and c1.axis == "env=stock:patched"
    with pytest.raises(SystemExit):
        p.parse_args([])
    with pytest.raises(e2e.ConfigError, match="NAME=PATH"):
        e2e.parse_pythons(["no-equals-sign"])


def test_runner_overrides(runner):
    from bench.harness.e2e import load_config

    cfg = load_config(BENCH / "configs" / "e2e-tiny.yaml")
    a = runner.build_parser().parse_args(["run", "--requests", "2", "--concurrency", "1,8",
                                          "--max-tokens", "5", "--datasets", "gsm8k"])
    cfg = runner.apply_overrides(cfg, a)
    assert (cfg["requests_per_level"], cfg["concurrency"], cfg["max_tokens"],
            cfg["datasets"]) == (2, [1, 8], 5, ["gsm8k"])


def test_allreduce_bench_args(arbench):
    a = arbench.resolve_args(arbench.build_parser().parse_args([]))
    assert a.tokens == (1, 4, 8, 16, 32, 64, 256) and a.hidden == 7168
    assert a.backend_list == ["nccl", "flashinfer_pcie_ipc"] and a.p2p == "both"
    c = arbench.resolve_args(arbench.build_parser().parse_args(["--device", "cpu", "--quick"]))
    assert c.backend_list == ["gloo"] and c.p2p == "default" and c.reps <= 10
    with pytest.raises(SystemExit):
        arbench.resolve_args(arbench.build_parser().parse_args(["--device", "cpu",
                                                                "--backends", "nccl"]))
    with pytest.raises(SystemExit):
        arbench.build_parser().parse_args(["--tokens", "0,4"])


def test_allreduce_launch_plan(arbench):
    a = arbench.resolve_args(arbench.build_parser().parse_args(["--launch", "8"]))
    plan = arbench.launch_plan(a)
    assert [(lbl, env) for lbl, env, _ in plan] == [
        ("nccl", {"NCCL_P2P_DISABLE": "0"}), ("nccl_p2p_off", {"NCCL_P2P_DISABLE": "1"})]
    assert plan[1][2] == ["nccl"]  # FlashInfer is measured once, NCCL in both settings
    a.p2p = "off"
    assert arbench.launch_plan(a)[0][:2] == ("nccl_p2p_off", {"NCCL_P2P_DISABLE": "1"})
    # sizes: [T, 7168] bf16 for the all-reduce; + [rows, 163840] logits for the all-gather
    assert arbench.allreduce_sizes((1, 4), 7168) == [14336, 57344]
    assert 163840 * 2 in arbench.allgather_sizes((1,), 7168, (1,), 163840)

"""Config loading and matrix expansion of the e2e runner."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.harness import e2e
from bench.harness.e2e import ConfigError, expand_matrix, normalize_config

CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"


def cfg(**over):
    base = {
        "name": "t", "model": "m",
        "matrix": {
            "env": {"stock": {"python": "@stock"},
                    "patched": {"python": "@patched", "env": {"VLLM_KIMI_EXT": "1"}}},
            "speculative": {"none": None,
                            "k3": {"speculative_config": {"method": "eagle3",
                                                          "model": e2e.TINY_EAGLE3,
                                                          "num_speculative_tokens": 3}}},
            "allreduce": {"nccl": None,
                          "fi": {"env": {"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": 1},
                                 "serve_args": ["--x", 1]}},
        },
        "datasets": ["gsm8k"], "concurrency": [1, 4],
    }
    base.update(over)
    return normalize_config(base)


PY = {"stock": "/opt/stock/bin/python", "patched": "/opt/patched/bin/python"}


def test_cartesian_product_in_axis_order():
    servers = expand_matrix(cfg(), pythons=PY, placeholders={e2e.TINY_EAGLE3: "/drafts/d"})
    assert len(servers) == 8
    assert servers[0].id == "env=stock,speculative=none,allreduce=nccl"
    assert servers[-1].id == "env=patched,speculative=k3,allreduce=fi"
    last = servers[-1]
    assert last.python == PY["patched"]
    assert last.env == {"VLLM_KIMI_EXT": "1", "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"}
    assert last.serve_args == ["--x", "1"]
    assert last.speculative_config == {"method": "eagle3", "model": "/drafts/d",
                                       "num_speculative_tokens": 3}
    assert servers[0].speculative_config is None and servers[0].env == {}


def test_excludes_and_select():
    c = cfg(exclude=[{"env": "stock", "allreduce": "fi"}])
    ids = [s.id for s in expand_matrix(c, pythons=PY)]
    assert len(ids) == 6 and not any("env=stock" in i and "allreduce=fi" in i for i in ids)
    sel = e2e.parse_select(["speculative=k3", "env=patched,stock"])
    ids = [s.id for s in expand_matrix(c, pythons=PY, select=sel)]
    assert ids == ["env=stock,speculative=k3,allreduce=nccl",
                   "env=patched,speculative=k3,allreduce=nccl",
                   "env=patched,speculative=k3,allreduce=fi"]
    with pytest.raises(ConfigError, match="no such axis"):
        expand_matrix(c, pythons=PY, select={"nope": {"x"}})
    with pytest.raises(ConfigError, match="unknown value"):
        expand_matrix(c, pythons=PY, select={"env": {"x"}})
    with pytest.raises(ConfigError, match="empty"):
        expand_matrix(cfg(exclude=[{"env": "stock"}, {"env": "patched"}]), pythons=PY)


def test_pythons_must_be_given_unless_allowed(tmp_path):
    with pytest.raises(ConfigError, match="--python stock=PATH"):
        expand_matrix(cfg())
    notes = []
    servers = expand_matrix(cfg(allow_same_python=True), notes=notes)
    assert {s.python for s in servers} == {sys.executable}
    assert any("@stock not given" in n for n in notes)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    s = expand_matrix(cfg(), pythons={"stock": str(venv), "patched": "/p"})[0]
    assert s.python == str(venv / "bin" / "python")


def test_conflicts_and_bad_configs():
    two_specs = cfg()
    two_specs["matrix"]["allreduce"]["fi"]["speculative_config"] = {"method": "mtp"}
    with pytest.raises(ConfigError, match="speculative_config"):
        expand_matrix(two_specs, pythons=PY)
    with pytest.raises(ConfigError, match="unknown key"):
        normalize_config({"name": "x", "model": "m", "matrix": {"a": {"b": None}}, "bogus": 1})
    with pytest.raises(ConfigError, match="missing"):
        normalize_config({"name": "x", "matrix": {"a": {"b": None}}})
    with pytest.raises(ConfigError, match="unknown key"):
        normalize_config({"name": "x", "model": "m", "matrix": {"a": {"b": {"pyton": "x"}}}})
    with pytest.raises(ConfigError, match="dataset"):
        normalize_config({"name": "x", "model": "m", "matrix": {"a": {"b": None}},
                          "datasets": ["mmlu"]})
    with pytest.raises(ConfigError, match="exclude"):
        normalize_config({"name": "x", "model": "m", "matrix": {"a": {"b": None}},
                          "exclude": [{"a": "c"}]})


def test_levels_and_command():
    c = cfg(temperature=[0.0, 0.7], datasets=["gsm8k", "mt-bench"])
    assert e2e.level_plan(c) == [("gsm8k", 0.0, 1), ("gsm8k", 0.0, 4), ("gsm8k", 0.7, 1),
                                 ("gsm8k", 0.7, 4), ("mt-bench", 0.0, 1), ("mt-bench", 0.0, 4),
                                 ("mt-bench", 0.7, 1), ("mt-bench", 0.7, 4)]
    s = expand_matrix(c, pythons=PY)[2]
    cmd = e2e.serve_command(s, "moonshotai/Kimi-K2.5", 8123)
    assert cmd[:5] == [PY["stock"], "-m", "vllm.entrypoints.cli.main", "serve",
                       "moonshotai/Kimi-K2.5"]
    assert cmd[cmd.index("--port") + 1] == "8123" and "127.0.0.1" in cmd
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 3


@pytest.mark.parametrize("name,launches", [("e2e-tiny.yaml", 4),
                                           ("e2e-kimi-k25-pcie8.yaml", 12)])
def test_shipped_configs_expand(name, launches):
    c = e2e.load_config(CONFIGS / name)
    servers = expand_matrix(c, pythons=PY, placeholders={e2e.TINY_EAGLE3: "/t/e"})
    assert len(servers) == launches
    assert len({s.id for s in servers}) == launches
    assert all(s.python in PY.values() for s in servers)
    patched = [s for s in servers if s.axes["env"] == "patched"]
    assert all(s.env.get("VLLM_KIMI_EXT") == "1" for s in patched)

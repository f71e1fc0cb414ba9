"""The pin check and the plugin entry point (no vLLM import needed)."""

from __future__ import annotations

import json
import logging

import pytest

from vllm_kimi_ext import compat, plugin
from vllm_kimi_ext.patchset import RECORD_RELPATH, read_series, series_record


@pytest.fixture()
def applied_tree(tmp_path):
    """A fake vLLM tree carrying the record of this package's series."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / RECORD_RELPATH).write_text(json.dumps(series_record(read_series())))
    return tmp_path


def test_matching_version_and_series_pass(applied_tree):
    assert compat.check_compat(version="0.34.0", tree=applied_tree) == []


def test_other_vllm_version_is_refused_with_override_hint(applied_tree, monkeypatch):
    monkeypatch.delenv(compat.ALLOW_MISMATCH_ENV, raising=False)
    with pytest.raises(compat.CompatError) as err:
        compat.check_compat(version="0.35.1", tree=applied_tree)
    assert "vLLM 0.34.0 required, found 0.35.1" in str(err.value)
    assert compat.ALLOW_MISMATCH_ENV in str(err.value)


def test_stock_tree_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(compat.ALLOW_MISMATCH_ENV, raising=False)
    (tmp_path / "vllm").mkdir()
    with pytest.raises(compat.CompatError, match="no applied-series record"):
        compat.check_compat(version="0.34.0", tree=tmp_path)


def test_tree_with_a_different_series_names_the_difference(applied_tree, monkeypatch):
    monkeypatch.delenv(compat.ALLOW_MISMATCH_ENV, raising=False)
    rec = json.loads((applied_tree / RECORD_RELPATH).read_text())
    rec["series"][0]["sha256"] = "0" * 64
    rec["series"].append({"name": "9999-local-hack.patch", "sha256": "1" * 64})
    rec["digest"] = "changed"
    (applied_tree / RECORD_RELPATH).write_text(json.dumps(rec))
    with pytest.raises(compat.CompatError) as err:
        compat.check_compat(version="0.34.0", tree=applied_tree)
    msg = str(err.value)
    assert "not in this package's series: 9999-local-hack.patch" in msg
    assert "different content: " + rec["series"][0]["name"] in msg


def test_override_env_downgrades_refusal(applied_tree, monkeypatch):
    monkeypatch.setenv(compat.ALLOW_MISMATCH_ENV, "1")  # read at call time
    problems = compat.check_compat(version="0.35.1", tree=applied_tree)
    assert problems == ["vLLM 0.34.0 required, found 0.35.1"]


def test_plugin_is_inert_unless_enabled(monkeypatch, caplog):
    monkeypatch.delenv(plugin.ENABLE_ENV, raising=False)
    called = []
    monkeypatch.setattr(compat, "check_compat", lambda **kw: called.append(1) or [])
    with caplog.at_level(logging.DEBUG, logger="vllm_kimi_ext"):
        plugin.register()
    assert called == []
    assert "inactive" in caplog.text


def test_plugin_refuses_on_mismatch_before_patching(monkeypatch):
    monkeypatch.setenv(plugin.ENABLE_ENV, "1")
    monkeypatch.delenv(compat.ALLOW_MISMATCH_ENV, raising=False)
    monkeypatch.setattr(compat, "installed_vllm_version", lambda: "0.33.0")
    from vllm_kimi_ext import runtime_patches

    applied = []
    monkeypatch.setattr(runtime_patches, "apply_all", lambda **kw: applied.append(kw))
    with pytest.raises(compat.CompatError, match="found 0.33.0"):
        plugin.register()
    assert applied == []


def test_plugin_register_is_reentrant(monkeypatch, applied_tree):
    monkeypatch.setenv(plugin.ENABLE_ENV, "1")
    monkeypatch.setattr(compat, "installed_vllm_version", lambda: "0.34.0")
    monkeypatch.setattr(compat, "vllm_tree", lambda: applied_tree)
    monkeypatch.setitem(plugin._state, "registered", False)
    from vllm_kimi_ext import runtime_patches

    applied = []
    monkeypatch.setattr(runtime_patches, "apply_all", lambda **kw: applied.append(kw) or [])
    plugin.register()
    plugin.register()
    assert applied == [{"count_every": 0}]


def test_count_env_parsing(monkeypatch):
    for raw, want in (("", 0), ("0", 0), ("1", 1), ("true", 1), ("50", 50)):
        monkeypatch.setenv(plugin.COUNT_ENV, raw)
        assert plugin._count_every() == want
    monkeypatch.setenv(plugin.COUNT_ENV, "often")
    with pytest.raises(ValueError, match="integer step interval"):
        plugin._count_every()


def test_entry_point_is_declared():
    from importlib import metadata

    eps = metadata.entry_points(group="vllm.general_plugins")
    assert any(ep.name == "kimi_ext" and ep.value == "vllm_kimi_ext.plugin:register"
               for ep in eps)

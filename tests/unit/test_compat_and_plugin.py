"""The pin check and the plugin entry point (no vLLM import needed)."""

from __future__ import annotations

import json
import logging

import pytest

from vllm_kimi_ext import compat, envs, plugin
from vllm_kimi_ext.patchset import (
    RECORD_RELPATH,
    SeriesEntry,
    fingerprint_files,
    series_record,
)

SERIES = [SeriesEntry("0001-a.patch", "a" * 64), SeriesEntry("0002-b.patch", "b" * 64)]


@pytest.fixture()
def applied_tree(tmp_path):
    """A fake vLLM tree with two patched files and the record of SERIES."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "a.py").write_text("patched = 1\n")
    (tmp_path / "vllm" / "b.py").write_text("patched = 2\n")
    record = series_record(SERIES, fingerprint_files(tmp_path, ["vllm/a.py", "vllm/b.py"]))
    (tmp_path / RECORD_RELPATH).write_text(json.dumps(record))
    return tmp_path


@pytest.fixture()
def expected(applied_tree):
    """What a package shipping SERIES expects (same record)."""
    return json.loads((applied_tree / RECORD_RELPATH).read_text())


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv(envs.ALLOW_MISMATCH.name, raising=False)


def test_matching_version_and_series_pass(applied_tree, expected):
    assert compat.check_compat(version="0.34.0", tree=applied_tree, expected=expected) == []


def test_other_vllm_version_is_refused_with_override_hint(applied_tree, expected):
    with pytest.raises(compat.CompatError) as err:
        compat.check_compat(version="0.35.1", tree=applied_tree, expected=expected)
    assert "vLLM 0.34.0 required, found 0.35.1" in str(err.value)
    assert envs.ALLOW_MISMATCH.name in str(err.value)


def test_stock_tree_is_refused(tmp_path, expected):
    stock = tmp_path / "stock"
    (stock / "vllm").mkdir(parents=True)
    with pytest.raises(compat.CompatError, match="no applied-series record"):
        compat.check_compat(version="0.34.0", tree=stock, expected=expected)


def test_tree_with_a_different_series_names_the_difference(applied_tree, expected):
    rec = json.loads((applied_tree / RECORD_RELPATH).read_text())
    rec["series"][0]["sha256"] = "0" * 64
    rec["series"].append({"name": "9999-local-hack.patch", "sha256": "1" * 64})
    rec["digest"] = "changed"
    (applied_tree / RECORD_RELPATH).write_text(json.dumps(rec))
    with pytest.raises(compat.CompatError) as err:
        compat.check_compat(version="0.34.0", tree=applied_tree, expected=expected)
    msg = str(err.value)
    assert "not in this package's series: 9999-local-hack.patch" in msg
    assert "different content: " + rec["series"][0]["name"] in msg


def test_record_says_applied_but_files_are_stock_is_refused(applied_tree, expected):
    (applied_tree / "vllm" / "b.py").write_text("stock = 2\n")
    with pytest.raises(compat.CompatError) as err:
        compat.check_compat(version="0.34.0", tree=applied_tree, expected=expected)
    msg = str(err.value)
    assert "disagrees with its files: 1 of 2 patched file(s) differ" in msg
    assert "(vllm/b.py)" in msg and "apply-patches" in msg
    (applied_tree / "vllm" / "a.py").unlink()  # a file the series adds, gone
    with pytest.raises(compat.CompatError, match=r"2 of 2 .*\(vllm/a\.py, vllm/b\.py\)"):
        compat.check_compat(version="0.34.0", tree=applied_tree, expected=expected)


def test_record_without_fingerprints_is_refused(applied_tree, expected):
    rec = json.loads((applied_tree / RECORD_RELPATH).read_text())
    del rec["files"]  # a record written before fingerprints existed
    (applied_tree / RECORD_RELPATH).write_text(json.dumps(rec))
    with pytest.raises(compat.CompatError, match="lists no file fingerprints"):
        compat.check_compat(version="0.34.0", tree=applied_tree, expected=expected)


def test_patched_files_other_than_the_package_expects_are_refused(applied_tree, expected):
    """Record and files agree, but not with what this package's series produces."""
    (applied_tree / "vllm" / "a.py").write_text("patched = 'locally'\n")
    rec = series_record(SERIES, fingerprint_files(applied_tree, ["vllm/a.py", "vllm/b.py"]))
    (applied_tree / RECORD_RELPATH).write_text(json.dumps(rec))
    with pytest.raises(compat.CompatError,
                       match="patched files differ from this package's series: vllm/a.py;"):
        compat.check_compat(version="0.34.0", tree=applied_tree, expected=expected)


@pytest.mark.parametrize("content", ["{not json", '{"series": "x"}', "[]"])
def test_corrupt_record_is_one_line_refusal(applied_tree, expected, content):
    (applied_tree / RECORD_RELPATH).write_text(content)
    with pytest.raises(compat.CompatError, match="corrupt series record") as err:
        compat.check_compat(version="0.34.0", tree=applied_tree, expected=expected)
    assert "\n" not in str(err.value)


def test_unreadable_package_series_is_refused(applied_tree, monkeypatch):
    monkeypatch.setattr(compat, "SHIPPED_SERIES", "no-such-series.json")
    with pytest.raises(compat.CompatError, match=r"patch series is unreadable: "
                                                 r"vllm_kimi_ext/no-such-series\.json"):
        compat.check_compat(version="0.34.0", tree=applied_tree)


def test_override_env_downgrades_refusal(applied_tree, expected, monkeypatch):
    monkeypatch.setenv(envs.ALLOW_MISMATCH.name, "1")  # read at call time
    problems = compat.check_compat(version="0.35.1", tree=applied_tree, expected=expected)
    assert problems == ["vLLM 0.34.0 required, found 0.35.1"]


def test_plugin_is_inert_unless_enabled(monkeypatch, caplog):
    monkeypatch.delenv(envs.ENABLE.name, raising=False)
    called = []
    monkeypatch.setattr(compat, "check_compat", lambda **kw: called.append(1) or [])
    with caplog.at_level(logging.DEBUG, logger="vllm_kimi_ext"):
        plugin.register()
    assert called == []
    assert "inactive" in caplog.text


def test_plugin_refuses_on_mismatch_before_patching(monkeypatch):
    monkeypatch.setenv(envs.ENABLE.name, "1")
    monkeypatch.delenv(envs.ALLOW_MISMATCH.name, raising=False)
    monkeypatch.setattr(compat, "installed_vllm_version", lambda: "0.33.0")
    from vllm_kimi_ext import runtime

    applied = []
    monkeypatch.setattr(runtime, "apply_all", lambda: applied.append(1))
    with pytest.raises(compat.CompatError, match="found 0.33.0"):
        plugin.register()
    assert applied == []


def test_plugin_register_is_reentrant(monkeypatch, applied_tree, expected):
    monkeypatch.setenv(envs.ENABLE.name, "1")
    monkeypatch.setattr(compat, "installed_vllm_version", lambda: "0.34.0")
    monkeypatch.setattr(compat, "vllm_tree", lambda: applied_tree)
    monkeypatch.setattr(compat, "expected_record", lambda: expected)
    monkeypatch.setitem(plugin._state, "registered", False)
    from vllm_kimi_ext import runtime

    applied = []
    monkeypatch.setattr(runtime, "apply_all", lambda: applied.append(1) or [])
    monkeypatch.setattr(plugin, "register_env_vars", lambda: [])
    plugin.register()
    plugin.register()
    assert applied == [1]


def test_plugin_refuses_an_invalid_flag_before_anything_else(monkeypatch, capsys):
    monkeypatch.setenv(envs.ENABLE.name, "1")
    monkeypatch.setenv(envs.COUNT_COLLECTIVES.name, "abc")
    checked = []
    monkeypatch.setattr(compat, "check_compat", lambda **kw: checked.append(1) or [])
    with pytest.raises(SystemExit) as err:
        plugin.register()
    assert err.value.code == 2
    assert capsys.readouterr().err.startswith(
        "vllm-kimi-ext: error: VLLM_KIMI_EXT_COUNT_COLLECTIVES='abc': expected a step")
    assert checked == []


def test_an_invalid_enable_value_is_refused_not_read_as_off(monkeypatch, capsys):
    monkeypatch.setenv(envs.ENABLE.name, "maybe")
    with pytest.raises(SystemExit):
        plugin.register()
    assert "VLLM_KIMI_EXT='maybe'" in capsys.readouterr().err


def test_entry_point_is_declared():
    from importlib import metadata

    eps = metadata.entry_points(group="vllm.general_plugins")
    assert any(ep.name == "kimi_ext" and ep.value == "vllm_kimi_ext.plugin:register"
               for ep in eps)

"""The verify-step figure of docs/cost-model.md (``verify_report.plot_verify``): one line per
verifier and Kimi sampling setting, plus the "both on" line, which follows what the plugin
runs per step (``verify_cost.price_both``)."""

from __future__ import annotations

import pytest

from vllm_kimi_ext.costmodel import plot, verify_report
from vllm_kimi_ext.costmodel import verify_cost as vc
from vllm_kimi_ext.costmodel.model import CostModel
from vllm_kimi_ext.costmodel.report import PCIE


def test_the_both_on_line_is_what_the_plugin_runs(tmp_path, monkeypatch):
    meas = vc.measurements()
    assert meas is not None
    figs = []
    real_save = plot._save
    monkeypatch.setattr(plot, "_save", lambda fig, path: figs.append(fig) or real_save(fig, path))
    out = verify_report.plot_verify(meas, tmp_path / "verify.png")
    assert out.stat().st_size > 10_000
    lines = {ln.get_label(): ln for ln in figs[0].axes[0].get_lines()}
    cm = CostModel.build(PCIE)
    for mode in vc.KIMI_MODES:
        words = verify_report.MODE_WORDS[mode]
        both = lines[f"both on (chosen per step), {words}"]
        for b, t in zip(both.get_xdata(), both.get_ydata()):
            assert t == pytest.approx(vc.price_both(cm, meas, int(b), 3, mode).total_us)
            bs = lines[f"batch-sharded, {words}"]
            assert t <= dict(zip(bs.get_xdata(), bs.get_ydata()))[b] + 1e-9
        for v in vc.VERIFIERS:
            assert f"{verify_report.SHORT[v]}, {words}" in lines

"""Patch 0007, configuration side: ``draft_tensor_parallel_size: 1`` is accepted
for dense standalone draft models (``draft_model``, ``kimi_tli``); for a
mixture-of-experts draft it is not honored (the draft stays sharded) and a warning at
configuration, before anything is built, says why.  The counted runtime
side is tests/distributed/test_patch_0007_draft_model_unsharded.py."""

from __future__ import annotations

import pytest

from testkit.draft_scenarios import unhonored_draft_tp_reason
from testkit.tli_scenarios import (
    write_retokenized_draft,
    write_tiny_qwen3_draft,
    write_tli_target,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target = write_tli_target(tmp_path_factory.mktemp("tp1-target"))
    dense = write_tiny_qwen3_draft(target, tmp_path_factory.mktemp("dense"), same_tokenizer=True)
    moe = write_retokenized_draft(target, tmp_path_factory.mktemp("moe"))
    return target, dense.path, moe.path


def _cfg(target, spec):
    from testkit.vllm_cpu import make_vllm_config
    from vllm_kimi_ext import plugin

    plugin.register_speculative_methods()
    return make_vllm_config(target, tensor_parallel_size=2, speculative_config=spec)


@pytest.mark.parametrize("method", ["draft_model", "kimi_tli"])
def test_dense_draft_model_accepts_draft_tp1(dirs, method):
    from vllm.v1.worker.gpu.spec_decode.unsharded_draft import draft_runs_unsharded

    target, dense, _ = dirs
    cfg = _cfg(target, {"method": method, "model": str(dense), "num_speculative_tokens": 3,
                        "draft_tensor_parallel_size": 1})
    assert cfg.speculative_config.draft_tensor_parallel_size == 1
    assert draft_runs_unsharded(cfg)


def test_moe_draft_tp1_stays_sharded_with_a_warning(dirs):
    from vllm.v1.worker.gpu.spec_decode.unsharded_draft import draft_runs_unsharded

    target, _, moe = dirs
    cfg = _cfg(target, {"method": "kimi_tli", "model": str(moe),
                        "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1})
    assert not draft_runs_unsharded(cfg)
    assert "is a mixture-of-experts model" in (unhonored_draft_tp_reason(cfg) or "")


def test_moe_draft_sharded_is_accepted(dirs):
    target, _, moe = dirs
    cfg = _cfg(target, {"method": "kimi_tli", "model": str(moe), "num_speculative_tokens": 3})
    assert cfg.speculative_config.draft_tensor_parallel_size == 2

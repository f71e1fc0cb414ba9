"""kimi_tli proposals through vLLM 0.34.0's GPU Gumbel sampler (with the draft-logits
cache) and rejection sampler: lossless by chi-square, planted bug caught
(bench/kernels/check_tli_vllm_kernels.py; the CPU tier covers the rest)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def test_tli_through_vllm_gpu_kernels(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "check_tli_vllm_kernels", ROOT / "bench" / "kernels" / "check_tli_vllm_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    src = next((p for p in (ROOT / ".vllm_src", ROOT / "build" / "vllm-0.34.0")
                if (p / "vllm").is_dir()), None)
    r = mod.run(100_000, 1.0, src)
    assert r["ok"], r["results"]

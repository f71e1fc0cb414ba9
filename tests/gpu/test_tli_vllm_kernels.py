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


def test_triton_gather_equals_reference_on_cuda():
    import torch

    from vllm_kimi_ext.drafts.tli.cross_tokenizer import VocabIntersection
    from vllm_kimi_ext.drafts.tli.maps import gather_table, gather_to_target, scatter_to_target

    vt, vd, shared = 163840, 151936, 120000
    g = torch.Generator().manual_seed(0)
    sd, st = torch.randperm(vd, generator=g)[:shared], torch.randperm(vt, generator=g)[:shared]
    table = gather_table(VocabIntersection.from_pairs(sd, st, vd, vt)).cuda()
    for rows in (1, 7, 64):
        logits = torch.randn(rows, vd, generator=g).to(torch.bfloat16).cuda()
        ref = scatter_to_target(logits, sd.cuda(), st.cuda(), vt)
        assert torch.equal(gather_to_target(logits, table), ref)

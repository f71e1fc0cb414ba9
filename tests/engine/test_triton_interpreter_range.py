"""The test kit's fix of Triton 3.9's interpreter ``tl.range`` (testkit/engine_ops.py):
vLLM's top-k/top-p Triton kernel, run under the interpreter as the engine tier runs it,
keeps exactly the tokens vLLM's PyTorch implementation keeps. Without the fix the kernel
raises (``row_id.to(tl.int64)`` on a Python int, ``topk_topp_triton.py:128``), so no top-k
or top-p request could be sampled in the CPU engine.

Runs in a child process: ``TRITON_INTERPRET`` must be set before Triton is imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.vllm]

SCRIPT = r"""
import json, torch
from testkit import engine_ops
installed = engine_ops.install()
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
from vllm.v1.sample.ops.topk_topp_triton import apply_top_k_top_p_triton
torch.manual_seed(0)
logits = torch.randn(4, 1280) * 3
k = torch.tensor([5, 1280, 1280, 40], dtype=torch.int32)
p = torch.tensor([1.0, 0.8, 0.95, 0.9])
a = apply_top_k_top_p_triton(logits.clone(), k, p) > -1e30
b = apply_top_k_top_p_pytorch(logits.clone(), k, p, allow_cpu_sync=True) > -1e30
print(json.dumps({"installed": installed, "kept": a.sum(1).tolist(),
                  "reference": b.sum(1).tolist(), "same": bool((a == b).all())}))
"""


def test_topk_topp_kernel_under_the_interpreter_matches_pytorch():
    from testkit.engine import ROOT, EngineSpec, engine_env

    env = engine_env(EngineSpec(model="unused"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "triton range" in out["installed"], out
    assert out["same"] and out["kept"] == out["reference"], out
    assert out["kept"][0] == 5 and all(1 <= n < 1280 for n in out["kept"]), out

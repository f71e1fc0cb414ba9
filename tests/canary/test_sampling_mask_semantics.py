"""Canary: vLLM 0.34.0's sampling mask is the one ``vllm_kimi_ext.verify`` reproduces.

The sharded verifier and its reference (``verify.reference.sampling_keep_mask``)
implement min-p, then top-k, then top-p on the temperature-scaled row, as
``Sampler.apply_sampling_params`` orders them. This runs vLLM's own PyTorch
``apply_top_k_top_p_pytorch`` (the definition its GPU Triton kernel approximates)
on continuous logits (no ties) and requires the same kept sets, except rows whose
cumulative mass lies within float32 rounding of ``top_p``. If an upgrade changes the
order, the strictness of the cut or the nucleus rule, this fails and
``verify/reference.py`` + ``verify/cuts.py`` must follow. The order of the stages
in ``apply_sampling_params`` is checked from its source.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from vllm_kimi_ext.verify.reference import sampling_keep_mask

pytestmark = [pytest.mark.vllm, pytest.mark.canary]


def test_top_k_top_p_mask_equals_vllm_pytorch_definition():
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    g = torch.Generator().manual_seed(0)
    n, V = 400, 3000
    z = torch.randn(n, V, generator=g) * torch.rand(n, 1, generator=g) * 4
    k = torch.where(torch.rand(n, generator=g) < 0.5, V, torch.randint(1, 200, (n,), generator=g))
    p = torch.where(torch.rand(n, generator=g) < 0.1, 1.0, torch.rand(n, generator=g) * 0.98 + 0.01)
    theirs = apply_top_k_top_p_pytorch(z.clone(), k.int(), p) > float("-inf")
    ours, margin = sampling_keep_mask(z, torch.where(k >= V, 0, k), torch.zeros(n), p)
    rounding = margin.nan_to_num(1.0) < 1e-6  # float32 cumsum on their side
    differ = (theirs != ours).any(dim=1)
    assert not bool((differ & ~rounding).any()), differ.nonzero().squeeze(1).tolist()
    assert int(ours.sum()) > n  # the masks really cut


def test_stage_order_in_apply_sampling_params():
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    src = inspect.getsource(Sampler.apply_sampling_params)
    stages = ["processor.apply", "apply_temperature", "apply_min_p", "apply_top_k_top_p"]
    pos = [src.index(s) for s in stages]
    assert pos == sorted(pos), dict(zip(stages, pos))

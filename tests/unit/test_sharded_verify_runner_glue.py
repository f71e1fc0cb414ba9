"""Eligibility and input mapping of the opt-in runner integration
(vllm_kimi_ext.verify.vllm_runner), on stand-in runner objects: which steps
take the sharded path, and which fall back with which counted reason."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_kimi_ext.verify import vllm_runner
from vllm_kimi_ext.verify.vllm_runner import _bonus_layout_drafts, ineligibility


def _runner(params, **over):
    sampler = SimpleNamespace(
        get_logprobs_dims=lambda idx: None, return_sampling_mask=False, compute_nans=False,
        trace_replay_state=None, logits_processors=[object()] * 3,
        **{vllm_runner._PARAMS_ATTR: dict(enumerate(params))})
    runner = SimpleNamespace(
        rejection_sampler=SimpleNamespace(use_block_verification=False, fly_window_size=0,
                                          synthetic_conditional_rates=None,
                                          watermark_key=None),
        batch_sharder=None, model=SimpleNamespace(compute_logits_local=lambda h: h),
        speculator=SimpleNamespace(draft_logits=None), sampler=sampler)
    for k, v in over.items():
        setattr(runner, k, v)
    return runner


def _batch(n, drafts=3):
    return SimpleNamespace(num_draft_tokens=drafts, idx_mapping_np=np.arange(n))


GREEDY = {"temperature": 0.0}
SAMPLE = {"temperature": 0.8, "top_k": 20}


def test_plain_verification_step_is_eligible():
    assert ineligibility(_runner([GREEDY, SAMPLE]), _batch(2), None, 8, 163840) is None


@pytest.mark.parametrize("tweak,reason", [
    (lambda r, b: setattr(b, "num_draft_tokens", 0), "not_verification"),
    (lambda r, b: setattr(r, "batch_sharder", object()), "batch_sharded_sampling"),
    (lambda r, b: setattr(r.rejection_sampler, "use_block_verification", True),
     "rejection_method"),
    (lambda r, b: setattr(r.rejection_sampler, "watermark_key", 3), "watermarking"),
    (lambda r, b: setattr(r.speculator, "draft_logits", object()), "probabilistic_draft"),
    (lambda r, b: setattr(r.sampler, "get_logprobs_dims", lambda i: (5, 0)), "logprobs"),
    (lambda r, b: setattr(r, "model", SimpleNamespace()), "no_compute_logits_local"),
])
def test_ineligible_steps_name_their_reason(tweak, reason):
    r, b = _runner([GREEDY, SAMPLE]), _batch(2)
    tweak(r, b)
    assert ineligibility(r, b, None, 8, 163840) == reason


def test_structured_output_tp1_and_request_params():
    assert ineligibility(_runner([GREEDY]), _batch(1), object(), 8, 100) == "structured_output"
    assert ineligibility(_runner([GREEDY]), _batch(1), None, 1, 100) == "tp1"
    top_p = _runner([GREEDY, {"temperature": 1.0, "top_p": 0.9}])
    assert ineligibility(top_p, _batch(2), None, 8, 100) == "top_p"
    pen = _runner([{"temperature": 0.7, "repetition_penalty": 1.1}])
    assert ineligibility(pen, _batch(1), None, 8, 100) == "penalties"
    unknown = _runner([GREEDY])
    assert ineligibility(unknown, SimpleNamespace(num_draft_tokens=1,
                                                  idx_mapping_np=np.array([5])),
                         None, 8, 100) == "unknown_sampling_params"


def test_bonus_layout_drafts_shifts_within_requests():
    # two requests: rows [0,1,2,3] (3 drafts) and [4,5] (1 draft); the input token
    # at each logits row is the previous token, the draft verified at row j is the
    # input of row j+1, the last row of each request is its bonus row.
    draft_sampled = torch.tensor([100, 11, 12, 13, 200, 21])
    cu = torch.tensor([0, 4, 6])
    assert _bonus_layout_drafts(draft_sampled, cu).tolist() == [11, 12, 13, -1, 21, -1]

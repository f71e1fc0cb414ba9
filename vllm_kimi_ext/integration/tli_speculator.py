"""The ``kimi_tli`` speculator: vLLM's standalone draft-model speculator, with the
draft speaking another vocabulary (see :mod:`vllm_kimi_ext.integration.tli_config`).

Two seams of ``StandaloneARSpeculator`` change, both pure device-side lookups
(static tables, no host sync, capturable in CUDA graphs):

* ``_run_model``: every input id the draft sees is a *target* id (the accepted
  context, the correction token, its own previous proposals); it is projected to
  the draft id fed at that position (:attr:`TLIMaps.target_to_draft_input`).
* ``compute_draft_logits``: the draft's ``[N, Vd]`` logits are placed at the
  target's ids, ``-inf`` off the intersection (one gather per target id: a Triton
  kernel on CUDA, 2.7 µs for one row over Kimi-K2.5's full vocabulary on an H200,
  ``bench/reports/tli-seams-h200``).  vLLM's sampler then draws the
  proposal from the restricted, renormalized distribution, caches exactly these
  logits for probabilistic verification, and the verifier compares against the
  target's probabilities over the same ids -- standard rejection sampling, so
  the output distribution is the target's.

Communication: the draft's own collectives are unchanged (the scatter and the
lookup are rank-local); nothing is added to verification.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator import StandaloneARSpeculator

from vllm_kimi_ext.drafts.tli.maps import gather_table, gather_to_target, project_inputs

from .tli_config import maps_for


class TLISpeculator(StandaloneARSpeculator):
    def __init__(self, vllm_config, device: torch.device):
        super().__init__(vllm_config, device)
        maps = maps_for(self.speculative_config)
        self.tli_maps = maps
        # Draft logits are cached (and verified) over the target's vocabulary.
        self.draft_vocab_size = maps.draft_vocab_size
        self.vocab_size = maps.target_vocab_size
        # [Vt]: the draft id whose logit lands at each target id (Vd: -inf)
        self.tli_gather_table = gather_table(maps.intersection).to(device)
        self.tli_input_table = maps.target_to_draft_input.to(device=device, dtype=torch.int32)

    def _run_model(self, input_ids: torch.Tensor, positions: torch.Tensor, *args, **kwargs):
        return super()._run_model(project_inputs(input_ids, self.tli_input_table), positions,
                                  *args, **kwargs)

    def compute_draft_logits(self, hidden_states: torch.Tensor, spec_step_idx: int) -> torch.Tensor:
        return gather_to_target(self.model.compute_logits(hidden_states), self.tli_gather_table)

    def get_draft_top_tokens(self, hidden_states: torch.Tensor, spec_step_idx: int):
        raise RuntimeError("kimi_tli does not support use_local_argmax_reduction "
                           "(refused at configuration time)")

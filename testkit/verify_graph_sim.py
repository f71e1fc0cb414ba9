"""Run :class:`~vllm_kimi_ext.verify.graph_step.GraphVerifyStep` on simulated TP ranks
(one thread per rank, real all-gather semantics) and compare it with the reference."""

from __future__ import annotations

import torch

from testkit.verify_equivalence import assert_equivalent
from testkit.verify_simulate import as_verify_output, simulate_graph_step
from vllm_kimi_ext.verify.batch import VerifyOutput
from vllm_kimi_ext.verify.graph_step import GraphVerifyStep
from vllm_kimi_ext.verify.reference import ReferenceVerifier


def recording_step(steps: list) -> type:
    """A :class:`GraphVerifyStep` class that appends every instance to ``steps`` (pass it
    as ``step_cls`` to see each simulated rank's step afterwards)."""

    class Step(GraphVerifyStep):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            steps.append(self)

    return Step


def dirty_scratch(steps: list, device: str) -> list[str]:
    """Names of the split escalation's persistent buffers left non-zero by any of
    ``steps`` (each step must leave them zeroed for the next)."""
    return [name for s in steps for st in [s._escalation_scratch.get(device)] if st
            for name in ("hist", "top", "done") if int(st[name].abs().sum())]


def check_graph_step(logits, batch, vocab_size, tp_size, draft_probs=None,
                     allow_first_row_deferral: bool = False, **kw):
    """Graph step on every rank == full-logits reference (token for token, up to certified
    rounding flips); ranks agree; a deferred request emits a prefix of the reference's
    tokens, at least one unless ``allow_first_row_deferral`` (the folded escalation defers
    a first row beyond its whole-row slots that its candidates cannot cut). Returns
    ``(rank-0 output, group, plan, deferred requests)``."""
    ref = ReferenceVerifier(vocab_size).verify(logits, batch, draft_probs)
    outs, group, plan = simulate_graph_step(logits, batch, tp_size, vocab_size, draft_probs,
                                            **kw)
    out = outs[0]
    for o in outs[1:]:
        assert torch.equal(o.sampled, out.sampled) and torch.equal(o.num_sampled, out.num_sampled)
    ours = as_verify_output(out)
    stopped = out.stopped.nonzero().squeeze(1).tolist()
    if stopped:
        ref_tok, our_tok = ref.tokens(), ours.tokens()
        sampled, num = ours.sampled.clone(), ours.num_sampled.clone()
        for i in stopped:
            assert allow_first_row_deferral or len(our_tok[i]) >= 1, \
                f"request {i} deferred at its first row"
            assert ref_tok[i][:len(our_tok[i])] == our_tok[i], (i, ref_tok[i], our_tok[i])
            sampled[i], num[i] = ref.sampled[i], ref.num_sampled[i]
        ours = VerifyOutput(sampled, num, ours.accept_margin, ours.nucleus_margin)
    assert_equivalent(ref, ours, batch, logits=logits, vocab_size=vocab_size,
                      draft_probs=draft_probs)
    return out, group, plan, stopped

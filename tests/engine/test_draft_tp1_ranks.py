"""Draft TP 1 at TP 2 (patches 0006 / 0007: ``draft_tensor_parallel_size: 1``): every rank
drafts with its own whole copy of the draft, and every rank must verify rank 0's draft
tokens. Tested on behaviour, not internals: one engine per draft kind, whose draft weights
are changed on one rank only (a test hook run in the worker,
:func:`testkit.engine_probes.perturb_draft`).

* rank 1's draft perturbed: output still equal to the engine without speculation, and
  with a self-draft (draft = target) every draft token is still accepted: rank 1's own
  drafts are not used. Were rank 1 to verify its own drafts, its input tokens would
  differ from rank 0's and the all-reduced target forward would mix them;
* rank 0's draft perturbed: output still equal (verification is lossless), but acceptance
  drops: the drafts the engine verifies are rank 0's;
* the collectives of every decode step of the first run, counted on every rank by the
  plugin's live counter, equal the cost model's draft-TP-1 count: 5 target + 1 verify + 1
  draft (rank 0's ``[batch, k]`` draft tokens broadcast), the same on both ranks. (The
  EAGLE-3 draft-TP-1 case of ``test_llama_tp2.py`` counts the same with another draft
  class, in the slow tier.)
"""

from __future__ import annotations

import pytest

from testkit.engine import Engine, EngineSpec
from testkit.engine_cases import (
    GREEDY,
    PROMPTS,
    K,
    Run,
    assert_same_tokens,
    cost_model_collectives,
    engine_steps,
    reference,
    speculative,
)
from testkit.engine_models import TinyLlamaSpec

pytestmark = [pytest.mark.vllm, pytest.mark.engine]

PERTURB = "testkit.engine_probes:perturb_draft"
RESTORE = "testkit.engine_probes:restore_draft"
COUNTING = {"VLLM_KIMI_EXT_COUNT_COLLECTIVES": "1000000"}  # counted, logged never


def _delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in ("num_drafts", "num_draft_tokens",
                                              "num_accepted_tokens")}


def _generate(eng: Engine) -> tuple[Run, dict]:
    before = eng.spec_metrics()
    outs = eng.generate(PROMPTS, GREEDY)
    return Run([o.token_ids for o in outs], {}, {}), _delta(eng.spec_metrics(), before)


@pytest.mark.parametrize("kind", ["self", pytest.param("eagle3", marks=pytest.mark.slow)])
def test_every_rank_verifies_rank0_drafts(llama, kind):
    spec = EngineSpec(llama["target"], tp=2, speculative_config=speculative(
        llama, kind, draft_tensor_parallel_size=1),
        plugin=True, env=COUNTING,
        llm_kwargs={"enable_prefix_caching": False})  # three identical runs, no cache hits
    ref = reference(EngineSpec(llama["target"], tp=2))  # plugin off, no speculation
    t = TinyLlamaSpec()
    want = cost_model_collectives(target_layers=t.num_hidden_layers, hidden=t.hidden_size,
                                  vocab=t.vocab_size, k=K, draft_layers=1, placement="tp1")
    with Engine(spec) as eng:
        eng.rpc("testkit.engine_probes:track_steps")
        base, m0 = _generate(eng)
        assert_same_tokens(base, ref, f"{kind}, draft TP 1")
        steps = engine_steps(eng.rpc("testkit.engine_probes:step_collectives"))
        assert len(steps) > 1, steps
        for i, got in enumerate(steps[:-1]):  # the last step drafts once (requests finish)
            assert got == want, f"{kind}: step {i} counted {got}, the cost model {want}"
        last = steps[-1]
        assert (last["target"], last["verify"]) == (want["target"], want["verify"]), last
        assert last["draft"] <= want["draft"], last
        assert eng.rpc(PERTURB, 1) == [False, True]
        run1, m1 = _generate(eng)
        assert_same_tokens(run1, ref, f"{kind}, draft TP 1, rank 1's draft perturbed")
        assert m1 == m0, f"rank 1's perturbed draft changed what was verified: {m1} vs {m0}"
        eng.rpc(RESTORE)
        assert eng.rpc(PERTURB, 0) == [True, False]
        run0, m_0 = _generate(eng)
        assert_same_tokens(run0, ref, f"{kind}, draft TP 1, rank 0's draft perturbed")
    if kind == "self":
        assert m0["num_accepted_tokens"] == m0["num_draft_tokens"], m0
        assert m_0["num_accepted_tokens"] < m0["num_accepted_tokens"], (
            f"perturbing rank 0's draft did not change acceptance: {m_0} vs {m0}")

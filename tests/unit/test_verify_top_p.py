"""Exact top-p over vocabulary shards: semantics, token-for-token equality, collectives.

* The reference's mask (min-p, top-k, top-p in vLLM's order; ties at a cut kept
  lowest id first) against a plain per-row Python model of that definition.
* The product's sharded step (``GraphVerifyStep``, simulated TP = 1, 2, 4, 8; real
  all-gather semantics) against the full-logits reference, token for token, with
  top-p alone and combined with top-k / min-p, on random, tie-heavy (bf16-rounded)
  and flat logits, with 2 candidates per rank so that the escalation round runs too.
* The collectives a step issues equal its plan (count and bytes).
* First and bonus tokens follow the renormalised nucleus (chi-square over 1e5 draws),
  ties at the cut included.
"""

from __future__ import annotations

import math

import pytest
import torch

from testkit.verify_cases import random_top_p_batch as _batch
from testkit.verify_cases import shaped_logits as _logits
from testkit.verify_equivalence import assert_equivalent
from testkit.verify_simulate import plan_for_layout, simulate_sharded_verify
from vllm_kimi_ext.verify import ReferenceVerifier, VerifyBatch
from vllm_kimi_ext.verify.reference import sampling_keep_mask

TPS = [1, 2, 4, 8]
NEG_INF = float("-inf")


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


# --- the definition, one row at a time ------------------------------------------
def plain_keep(s: list[float], top_k: int, min_p: float, top_p: float) -> set[int]:
    """Kept ids of one scaled row: sort by (value desc, id asc); min-p keeps values
    >= max + log(min_p); top-k the first k; top-p the shortest prefix whose mass
    (softmax over what is left) reaches top_p."""
    order = sorted((i for i in range(len(s)) if s[i] > NEG_INF), key=lambda i: (-s[i], i))
    if min_p > 0:
        cut = float(torch.tensor(s[order[0]]) + torch.log(torch.tensor(min_p)))
        order = [i for i in order if s[i] >= cut]
    if top_k > 0:
        order = order[:top_k]
    if top_p < 1:
        m = s[order[0]]
        w = [math.exp(s[i] - m) for i in order]
        total = math.fsum(w)
        kept, mass = [], 0.0
        for i, wi in zip(order, w):
            if kept and mass >= top_p:
                break
            kept.append(i)
            mass += wi / total
        order = kept
    return set(order)


def test_reference_mask_matches_plain_definition():
    g = torch.Generator().manual_seed(0)
    V, n = 40, 300
    s = torch.randint(-3, 4, (n, V), generator=g).float() * 0.5  # many exact ties
    s[::5] = torch.randn(n // 5, V, generator=g) * 2
    s[3::7, 10:20] = NEG_INF
    top_k = torch.where(torch.rand(n, generator=g) < 0.4,
                        torch.randint(1, 12, (n,), generator=g), 0)
    min_p = torch.where(torch.rand(n, generator=g) < 0.3, torch.rand(n, generator=g) * 0.3, 0.0)
    top_p = torch.where(torch.rand(n, generator=g) < 0.8, torch.rand(n, generator=g) * 0.98 + 0.01,
                        1.0)
    keep, margin = sampling_keep_mask(s, top_k, min_p, top_p)
    for r in range(n):
        if not math.isnan(float(margin[r])):
            assert float(margin[r]) >= 0
        if float(margin[r]) < 1e-9:
            continue  # a cumulative mass within rounding of top_p: either answer is right
        want = plain_keep(s[r].tolist(), int(top_k[r]), float(min_p[r]), float(top_p[r]))
        got = set(keep[r].nonzero().squeeze(1).tolist())
        assert got == want, (r, sorted(got), sorted(want))


def test_top_k_ties_keep_exactly_k_lowest_ids():
    s = torch.tensor([[1.0, 3.0, 2.0, 2.0, 2.0, 2.0, 0.0]])
    keep, _ = sampling_keep_mask(s, torch.tensor([3]), torch.zeros(1), torch.ones(1))
    assert keep[0].nonzero().squeeze(1).tolist() == [1, 2, 3]


def test_top_p_ties_keep_lowest_ids_until_the_mass_is_reached():
    # p = softmax: one token of weight e^1, four tied tokens of weight 1 each.
    s = torch.tensor([[0.0, NEG_INF, 1.0, 0.0, 0.0, 0.0]])
    e = math.e
    total = e + 4
    # mass after the top token e/total = 0.405; each tied token adds 0.149
    keep, margin = sampling_keep_mask(s, torch.zeros(1, dtype=torch.long), torch.zeros(1),
                                      torch.tensor([(e + 1.5) / total]))
    assert keep[0].nonzero().squeeze(1).tolist() == [0, 2, 3]
    assert 0 < float(margin[0]) < 0.1


def test_invalid_top_p_is_refused():
    b = VerifyBatch.from_draft_tokens([[1]], [1.0], [0], top_p=[0.0])
    with pytest.raises(ValueError, match="top_p"):
        b.layout()


# --- sharded == reference ---------------------------------------------------------
def _check(z, b, V, tp, q=None, **kw):
    ref = ReferenceVerifier(V).verify(z, b, q)
    out, group, outs = simulate_sharded_verify(z, b, tp, V, q, pad_value=1e30, **kw)
    for o in outs[1:]:
        assert torch.equal(o.sampled, out.sampled) and torch.equal(o.num_sampled, out.num_sampled)
    rep = assert_equivalent(ref, out, b, logits=z, vocab_size=V, draft_probs=q)
    return rep, group


def _run_and_check_plan(z, b, V, tp, q=None, **kw):
    """Token for token against the reference; every rank's all-gathers are its plan's."""
    rep, group = _check(z, b, V, tp, q, **kw)
    plan = plan_for_layout(b.layout(), tp_size=tp, shard_width=-(-V // tp), vocab_size=V,
                           probabilistic=q is not None, logits_bytes=z.element_size(),
                           escalation_slots=b.num_rows, **kw)
    for calls in group.calls:
        assert [s for s, _ in calls] == [(r.rows, r.width) for r in plan.rounds]
        assert sum(nb for _, nb in calls) == plan.bytes_sent_per_rank
    return rep, group, plan


KINDS = ["random", "ties", "flat", "coarse"]
MIXES = ["top_p", "top_p_top_k", "top_p_min_p", "mixed"]


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mix", MIXES)
def test_top_p_sharded_equals_reference(tp, kind, mix):
    V = 211  # TP = 8: shards of 27, the last one padded
    g = torch.Generator().manual_seed(100 * tp + 10 * KINDS.index(kind) + MIXES.index(mix))
    b = _batch(g, 40, V, mix)
    z = _logits(g, b, V, kind)
    _run_and_check_plan(z, b, V, tp)  # 128 candidates >= the shard: one round
    _, _, plan = _run_and_check_plan(z, b, V, tp, candidates=2)
    assert plan.escalation_slots == b.num_rows


@pytest.mark.parametrize("tp", [2, 4])
def test_probabilistic_drafts_with_top_p(tp):
    V = 97
    g = torch.Generator().manual_seed(40 + tp)
    b = _batch(g, 60, V, "mixed")
    z = _logits(g, b, V, "random")
    q = torch.softmax(z.float() + torch.randn(z.shape, generator=g), dim=1)
    x = torch.multinomial(q, 1, generator=g).squeeze(1)
    b = b.replace(draft_token_ids=torch.where(b.layout().is_bonus, -1, x))
    _, _, plan = _run_and_check_plan(z, b, V, tp, q, candidates=4)
    assert [r.name for r in plan.rounds] == ["stats+candidates", "escalation", "residual"]


# --- distribution: chi-square over 1e5 draws ------------------------------------------
N = 100_000
DV = 18  # TP = 4: shards of 5, the last one padded
DTP = 4
ALPHA = 1e-4  # a correct verifier must reach p >= ALPHA; the planted bugs land far below


def _mode(name: str):
    """(z0 [DV], temperature, top_k, min_p, top_p, probabilistic)."""
    g = torch.Generator().manual_seed(2024)
    z0 = torch.randn(DV, generator=g) * 1.5
    if name == "top_p":
        return z0, 1.0, 0, 0.0, 0.8, False
    if name == "top_p_top_k":
        return z0, 0.7, 6, 0.0, 0.9, False
    if name == "top_p_min_p":
        return z0, 1.3, 0, 0.05, 0.85, False
    if name == "top_p_probabilistic":
        return z0, 1.0, 0, 0.0, 0.9, True
    if name == "top_p_ties":
        # one top token, five tied tokens on three shards; the nucleus keeps the first
        # two (ids 1, 2) and drops id 4 on the same shard and ids 12, 16 on others
        z0 = -1.0 - 0.1 * torch.arange(DV, dtype=torch.float32)
        z0[8] = 2.5
        z0[[1, 2, 4, 12, 16]] = 1.0
        w = torch.exp(z0.double())
        p_top, p_tie = float(w[8] / w.sum()), float(w[1] / w.sum())
        return z0, 1.0, 0, 0.0, p_top + 1.5 * p_tie, False
    raise KeyError(name)


def _target(name):
    z0, T, k, mp, tp_, _ = _mode(name)
    s = (z0 / T).tolist()
    kept = sorted(plain_keep(s, k, mp, tp_))
    p = torch.zeros(DV, dtype=torch.float64)
    p[kept] = torch.softmax(torch.tensor([s[i] for i in kept], dtype=torch.float64), 0)
    return p


def _draw(name, kind, n=N):
    """First tokens and bonus tokens of ``n`` one-draft requests, verified by ``kind``."""
    z0, T, k, mp, tp_, probabilistic = _mode(name)
    g = torch.Generator().manual_seed(101 + sum(map(ord, name)))
    q0 = torch.softmax(z0 * 0.7 + torch.randn(DV, generator=g), dim=0)
    x = torch.multinomial(q0, n, replacement=True, generator=g)
    logits = z0[None, :].expand(2 * n, DV).contiguous()
    b = VerifyBatch.from_draft_tokens(x[:, None], torch.full((n,), T), torch.arange(n) * 7919 + 3,
                                      top_k=torch.full((n,), k), min_p=torch.full((n,), mp),
                                      top_p=torch.full((n,), tp_))
    q = q0[None, :].expand(2 * n, DV).contiguous() if probabilistic else None
    if kind == "reference":
        out = ReferenceVerifier(DV).verify(logits, b, q)
    else:
        out, _, _ = simulate_sharded_verify(logits, b, DTP, DV, q, pad_value=1e30,
                                            candidates=2)
    first = out.sampled[:, 0]
    bonus = out.sampled[out.num_sampled == 2, 1]
    return torch.bincount(first, minlength=DV), torch.bincount(bonus, minlength=DV)


def _fits(counts, p) -> tuple[bool, float]:
    from testkit.verify_equivalence import chi_square

    if int(counts[p == 0].sum()) > 0:
        return False, 0.0  # a token outside the nucleus was emitted
    _, pval, _ = chi_square(counts, p)
    return pval >= ALPHA, pval


DIST_MODES = ["top_p", "top_p_top_k", "top_p_min_p", "top_p_probabilistic", "top_p_ties"]


@pytest.mark.parametrize("kind", ["reference", "sharded"])
@pytest.mark.parametrize("mode", DIST_MODES)
def test_first_and_bonus_tokens_follow_the_nucleus(mode, kind):
    """Accept test, recovered token and bonus token all use the renormalised nucleus."""
    p = _target(mode)
    assert 2 <= int((p > 0).sum()) < DV  # the nucleus really cuts
    first, bonus = _draw(mode, kind)
    ok, pval = _fits(first, p)
    assert ok, f"{mode}/{kind}: first tokens p={pval:.2e}"
    assert int(bonus.sum()) > N // 20
    ok, pval = _fits(bonus, p)
    assert ok, f"{mode}/{kind}: bonus tokens p={pval:.2e}"

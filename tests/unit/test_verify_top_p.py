"""Exact top-p over vocabulary shards: semantics, token-for-token equality, collectives.

* The reference's mask (min-p, top-k, top-p in vLLM's order; ties at a cut kept
  lowest id first) against a plain per-row Python model of that definition.
* The sharded verifier (simulated TP = 1, 2, 4, 8; real all-gather semantics)
  against the full-logits reference, token for token, with top-p alone and
  combined with top-k / min-p, on random, tie-heavy (bf16-rounded) and flat
  logits, with a small first-round width ``m`` so that the wider rounds and the
  whole-shard round run too.
* The collectives a step issues equal its plan (count and bytes per row) per mode.
* Planted bugs (nucleus cut off by one candidate either way, nucleus mass from
  unnormalised p, tied tokens at the cut dropped or all kept) make the
  token-for-token check fail.
"""

from __future__ import annotations

import math

import pytest
import torch

import vllm_kimi_ext.verify.cuts as cuts
import vllm_kimi_ext.verify.sharded as sharded
from testkit.verify_cases import random_top_p_batch as _batch
from testkit.verify_cases import shaped_logits as _logits
from testkit.verify_equivalence import assert_equivalent
from testkit.verify_simulate import simulate_sharded_verify
from vllm_kimi_ext.verify import BatchModes, ReferenceVerifier, VerifyBatch, comm_plan
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


class _PlanRecorder(sharded.VocabShardedVerifier):
    """Keeps each rank's verifier so the test can read ``last_plan``/``escalations``."""

    made: list = []

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        _PlanRecorder.made.append(self)


def _run_and_check_plan(z, b, V, tp, q=None, **kw):
    _PlanRecorder.made = []
    rep, group = _check(z, b, V, tp, q, verifier_cls=_PlanRecorder, **kw)
    for v in _PlanRecorder.made:
        calls = group.calls[v.rank]
        assert [s for s, _ in calls] == [(c.rows, c.width) for c in v.last_plan.collectives]
        assert sum(nb for _, nb in calls) == v.last_plan.bytes_sent_per_rank
    return rep, group, _PlanRecorder.made


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
    _run_and_check_plan(z, b, V, tp)  # default m (64 > shard: one round)
    _, _, made = _run_and_check_plan(z, b, V, tp, top_p_width=2, top_p_escalation=(6,))
    if tp > 1 and kind == "flat" and mix == "top_p":
        esc = made[0].escalations
        assert esc["top_p_round_6"] > 0 and esc[f"top_p_round_{-(-V // tp)}"] > 0, esc


@pytest.mark.parametrize("tp", [2, 4])
def test_probabilistic_drafts_with_top_p(tp):
    V = 97
    g = torch.Generator().manual_seed(40 + tp)
    b = _batch(g, 60, V, "mixed")
    z = _logits(g, b, V, "random")
    q = torch.softmax(z.float() + torch.randn(z.shape, generator=g), dim=1)
    x = torch.multinomial(q, 1, generator=g).squeeze(1)
    b = b.replace(draft_token_ids=torch.where(b.layout().is_bonus, -1, x))
    _, group, _ = _run_and_check_plan(z, b, V, tp, q, top_p_width=4, top_p_escalation=(12,))
    assert len(group.calls[0]) >= 3  # threshold, stats, residual (+ wider top-p rounds)


# --- collectives per mode -----------------------------------------------------------
@pytest.mark.parametrize("tp", [2, 8])
def test_collectives_per_mode(tp):
    """One-round top-p (peaked rows: the nucleus fits in m) = 2 all-gathers: 4·(m+2) B
    per top-p row, then 16 B per row; top-k wider than m sets the width."""
    V, n, m = 400, 12, 8
    g = torch.Generator().manual_seed(tp)
    drafts = torch.randint(0, V, (n, 3), generator=g)
    z = torch.randn(4 * n, V, generator=g)
    z[:, :6] += torch.arange(6, 0, -1) * 4.0  # 6 dominant tokens: nucleus <= 6 < m
    cases = {
        "top_p": dict(top_p=[0.95] * n),
        "top_p_top_k": dict(top_p=[0.95] * n, top_k=[20] * n),
        "top_p_min_p": dict(top_p=[0.9] * n, min_p=[0.05] * n),
    }
    for name, kw in cases.items():
        b = VerifyBatch.from_draft_tokens(drafts, [1.0] * n, list(range(n)), **kw)
        _, group, made = _run_and_check_plan(z, b, V, tp, top_p_width=m)
        base = comm_plan(b.num_rows, tp, BatchModes.from_batch(b, V, False, m))
        width = max(m, 20 if "top_k" in name else 1) + 2
        assert [c.name for c in base.collectives] == ["threshold", "stats"]
        assert base.collectives[0].width == width
        assert base.bytes_sent_per_rank == b.num_rows * (4 * width + 16)
        for v in made:
            assert v.last_plan == base, name  # no wider round was needed
            assert len(group.calls[v.rank]) == 2


# --- planted bugs -------------------------------------------------------------------
def _off_by_one(delta):
    real = cuts._nucleus_count

    def wrong(before, top_p, cand):
        return (real(before, top_p, cand) + delta).clamp(min=1)

    return wrong


def _unnormalised(w, lse_all, bounded):
    return w.max(dim=1).values  # p = exp(s - max): not divided by the total mass


def _tie_policy(lim_for):
    real = sharded.local_cut

    def wrong(vals, cols, merged, rank, shard_width):
        thr, lim = real(vals, cols, merged, rank, shard_width)
        return thr, lim_for(lim, shard_width)

    return wrong


PLANTED = {
    "nucleus_one_too_many": ("cuts", "_nucleus_count", _off_by_one(+1)),
    "nucleus_one_too_few": ("cuts", "_nucleus_count", _off_by_one(-1)),
    "nucleus_mass_unnormalised": ("cuts", "_log_normaliser", _unnormalised),
    "ties_dropped": ("sharded", "local_cut", _tie_policy(lambda lim, S: torch.full_like(lim, -1))),
    "ties_all_kept": ("sharded", "local_cut", _tie_policy(lambda lim, S: torch.full_like(lim, S))),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_is_caught(bug, monkeypatch):
    where, name, fn = PLANTED[bug]
    monkeypatch.setattr(cuts if where == "cuts" else sharded, name, fn)
    V, tp = 211, 4
    g = torch.Generator().manual_seed(7)
    b = _batch(g, 60, V, "top_p")
    z = _logits(g, b, V, "coarse")
    with pytest.raises(AssertionError):
        _check(z, b, V, tp)


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


def _draw(name, kind, patch=None, n=N):
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
        mp_ = pytest.MonkeyPatch()
        try:
            if patch is not None:
                where, attr, fn = PLANTED[patch]
                mp_.setattr(cuts if where == "cuts" else sharded, attr, fn)
            out, _, _ = simulate_sharded_verify(logits, b, DTP, DV, q, pad_value=1e30,
                                                top_p_width=2, top_p_escalation=(3,))
        finally:
            mp_.undo()
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


@pytest.mark.parametrize("mode,bug", [
    ("top_p", "nucleus_one_too_many"),
    ("top_p", "nucleus_one_too_few"),
    ("top_p", "nucleus_mass_unnormalised"),
    ("top_p_top_k", "nucleus_mass_unnormalised"),
    ("top_p_ties", "ties_dropped"),
    ("top_p_ties", "ties_all_kept"),
])
def test_planted_bug_fails_chi_square(mode, bug):
    """2e4 draws suffice to reject each planted bug (its chi-square is in the hundreds
    or it emits a token outside the nucleus)."""
    first, _ = _draw(mode, "sharded", patch=bug, n=N // 5)
    ok, pval = _fits(first, _target(mode))
    assert not ok, f"{bug} passed the {mode} chi-square (p={pval:.2e})"


def test_default_width_rule():
    """m = 128, more while the round fits 16 KiB per rank, at most the escalation width."""
    from vllm_kimi_ext.verify.sharded import top_p_width_for

    def modes(reqs, **kw):
        b = VerifyBatch.from_draft_tokens([[1, 2, 3]] * reqs, [1.0] * reqs, list(range(reqs)),
                                          top_p=[0.95] * reqs, **kw)
        return b.layout().host_modes(163840)

    assert top_p_width_for(modes(1), None) == 1022  # B=1, k=3: 4 rows x 4 KiB
    assert top_p_width_for(modes(4), None) == 254
    assert top_p_width_for(modes(16), None) == 128  # floor
    assert top_p_width_for(modes(1), 32) == 32
    p = comm_plan(4, 8, BatchModes.from_batch(
        VerifyBatch.from_draft_tokens([[1, 2, 3]], [1.0], [0], top_p=[0.95]), 163840, False))
    assert p.collectives[0].width == 1024 and p.bytes_sent_per_rank == 4 * 4 * 1024 + 4 * 16

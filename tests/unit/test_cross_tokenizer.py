"""Token-Level Intersection drafting: intersection maps, losslessness, acceptance.

Losslessness is tested statistically: 200 000 vectorized draws with fixed seeds;
the histogram of the emitted token must match the target distribution ``p`` by a
chi-square goodness-of-fit test at significance ALPHA = 1e-3 (p-value from the
regularized upper incomplete gamma function).  Two deliberately wrong variants
(q not renormalized after restriction; recovery sampled from p instead of the
residual) must fail the same test (p-value < 1e-12).  The closed-form output
distribution of one rejection step is checked as well.
"""

from __future__ import annotations

import pytest
import torch

from testkit.tokenizers import write_kimi_tokenizer, write_variant
from vllm_kimi_ext.drafts.cross_tokenizer import (
    build_intersection,
    expected_acceptance,
    intersection_from_tokenizer_dirs,
    rejection_step,
    sample_categorical,
    tli_propose,
    verify_chain,
)

N_DRAWS = 200_000
ALPHA = 1e-3

# Target vocabulary of 12 tokens, draft vocabulary of 10; 7 shared, at different ids.
# Special tokens are keyed by name (str), regular tokens by bytes.
T_KEYS = [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i", b"j", "<think>", "</think>"]
D_KEYS = ["</think>", b"x", b"g", b"a", b"y", b"c", b"e", b"z", b"b", "<think>"]
P = torch.tensor(
    [0.16, 0.04, 0.12, 0.02, 0.10, 0.08, 0.05, 0.09, 0.03, 0.11, 0.13, 0.07], dtype=torch.float64
)
# 31 % of the draft's mass sits on draft-only tokens (x, y, z).
Q_DRAFT = torch.tensor(
    [0.10, 0.14, 0.02, 0.20, 0.09, 0.03, 0.12, 0.08, 0.17, 0.05], dtype=torch.float64
)


def chi_square_pvalue(counts: torch.Tensor, p: torch.Tensor) -> float:
    n = counts.sum()
    keep = p > 0
    if bool((counts[~keep] > 0).any()):
        return 0.0  # emitted a token the target gives probability 0
    exp = n * p[keep]
    stat = ((counts[keep] - exp) ** 2 / exp).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def one_step_output_distribution(p, q_verify, q_sample, recover="residual"):
    """Closed form of P(emitted = y) for proposals x ~ q_sample verified with q_verify."""
    ratio = torch.where(q_verify > 0, p / q_verify.clamp_min(1e-300), torch.ones_like(p))
    accepted = q_sample * ratio.clamp(max=1.0)
    r = (p - q_verify).clamp_min(0) if recover == "residual" else p
    return accepted + (1 - accepted.sum()) * r / r.sum()


@pytest.fixture(scope="module")
def inter():
    return build_intersection(D_KEYS, T_KEYS)


def test_intersection_maps(inter):
    assert inter.draft_vocab_size == 10 and inter.target_vocab_size == 12 and inter.size == 7
    assert inter.draft_to_target.tolist() == [11, -1, 6, 0, -1, 2, 4, -1, 1, 10]
    for d, t in enumerate(inter.draft_to_target.tolist()):
        if t >= 0:
            assert D_KEYS[d] == T_KEYS[t] and inter.target_to_draft[t] == d
    assert inter.map_target_tokens(torch.tensor([0, 3, 11])).tolist() == [3, -1, 0]
    # a special token never matches the same text as bytes
    assert build_intersection(["<think>"], [b"<think>"]).size == 0
    with pytest.raises(ValueError, match="target vocabulary has token b'a' at ids 0 and 2"):
        build_intersection([b"a"], [b"a", b"b", b"a"])


def test_map_probs(inter):
    q = inter.map_probs(Q_DRAFT[None])[0]
    assert torch.isclose(q.sum(), torch.tensor(1.0, dtype=torch.float64))
    mass = Q_DRAFT[inter.draft_mask].sum()
    for d, t in enumerate(inter.draft_to_target.tolist()):
        if t >= 0:
            assert torch.isclose(q[t], Q_DRAFT[d] / mass)
    unshared_targets = [t for t in range(12) if inter.target_to_draft[t] < 0]
    assert q[unshared_targets].abs().sum() == 0
    with pytest.raises(ValueError, match="last dimension 12, expected 10"):
        inter.restrict(P[None])


def _run(inter, variant: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    draft_rows = Q_DRAFT.expand(N_DRAWS, -1)
    _, target_ids, q = tli_propose(draft_rows, inter, g)
    p_rows = P.expand(N_DRAWS, -1)
    if variant == "tli":
        acc, tok = rejection_step(p_rows, q, target_ids, g)
    elif variant == "unnormalized_q":
        # proposals still come from the renormalized q (sampling normalizes anyway),
        # but the verifier is handed the restricted, unnormalized q
        q_bad = inter.map_probs(draft_rows, renormalize=False)
        acc, tok = rejection_step(p_rows, q_bad, target_ids, g)
    elif variant == "recover_from_p":
        u = torch.rand(N_DRAWS, dtype=torch.float64, generator=g)
        px = p_rows.gather(1, target_ids[:, None]).squeeze(1)
        qx = q.gather(1, target_ids[:, None]).squeeze(1)
        acc = u * qx < px
        tok = torch.where(acc, target_ids, sample_categorical(p_rows, g))
    else:
        raise AssertionError(variant)
    return acc, torch.bincount(tok, minlength=12).to(torch.float64)


def test_tli_is_lossless(inter):
    q = inter.map_probs(Q_DRAFT[None])[0]
    exact = one_step_output_distribution(P, q, q)
    assert torch.allclose(exact, P, atol=1e-12)
    acc, counts = _run(inter, "tli", seed=1234)
    pval = chi_square_pvalue(counts, P)
    assert pval > ALPHA, f"chi-square p-value {pval:.3g} <= {ALPHA}"
    # empirical acceptance matches sum(min(p, q))
    a = float(expected_acceptance(P, q))
    assert abs(float(acc.double().mean()) - a) < 5 * (a * (1 - a) / N_DRAWS) ** 0.5


@pytest.mark.parametrize("variant", ["unnormalized_q", "recover_from_p"])
def test_wrong_variants_fail_the_same_test(inter, variant):
    q = inter.map_probs(Q_DRAFT[None])[0]
    if variant == "unnormalized_q":
        exact = one_step_output_distribution(
            P, inter.map_probs(Q_DRAFT[None], renormalize=False)[0], q
        )
    else:
        exact = one_step_output_distribution(P, q, q, recover="p")
    assert 0.5 * (exact - P).abs().sum() > 0.1  # total-variation bias of the wrong variant
    _, counts = _run(inter, variant, seed=1234)
    assert chi_square_pvalue(counts, P) < 1e-12


def test_verify_chain_is_lossless_and_accepts_as_predicted(inter):
    k, n = 3, N_DRAWS // 4
    g = torch.Generator().manual_seed(7)
    draft_rows = Q_DRAFT.expand(n * k, -1)
    _, target_ids, q = tli_propose(draft_rows, inter, g)
    tokens, num_acc = verify_chain(
        P.expand(n, k + 1, -1), q.view(n, k, -1), target_ids.view(n, k), g
    )
    assert chi_square_pvalue(torch.bincount(tokens[:, 0], minlength=12).double(), P) > ALPHA
    a = float(expected_acceptance(P, q[0]))
    predicted = sum(a**j for j in range(1, k + 1))
    assert abs(float(num_acc.double().mean()) - predicted) < 0.02  # ~4.5 standard errors
    assert bool(((tokens >= 0).sum(dim=1) == num_acc + 1).all())


def test_reference_verifier_accepts_tli_q(inter):
    """The project's full-vocabulary reference verifier, fed TLI's q, is lossless too."""
    ref = pytest.importorskip("vllm_kimi_ext.verify.reference")
    batch_mod = pytest.importorskip("vllm_kimi_ext.verify.batch")
    n = 20_000
    g = torch.Generator().manual_seed(99)
    _, target_ids, q = tli_propose(Q_DRAFT.expand(n, -1), inter, g)
    batch = batch_mod.VerifyBatch.from_draft_tokens(
        target_ids[:, None], temperature=[1.0] * n, seeds=list(range(1, n + 1))
    )
    logits = torch.log(P).float().repeat(2 * n, 1)  # draft row + bonus row per request
    probs = torch.zeros(2 * n, 12)
    probs[0::2] = q.float()
    out = ref.ReferenceVerifier(12).verify(logits, batch, draft_probs=probs)
    first = out.sampled[:, 0]
    assert chi_square_pvalue(torch.bincount(first, minlength=12).double(), P) > ALPHA


def test_kimi_special_drift_maps_by_name(tmp_path):
    n = 1024
    t = write_kimi_tokenizer(tmp_path / "t", n_ranks=n)
    d = write_variant(tmp_path / "d", "special_move", n_ranks=n)
    inter = intersection_from_tokenizer_dirs(
        d, t, draft_vocab_size=n + 256, target_vocab_size=n + 256
    )
    assert inter.draft_to_target[n + 24] == n + 23  # </think> moved in the draft
    assert inter.draft_to_target[n + 22] == n + 22  # <think> unchanged
    assert bool((inter.draft_to_target[:n] == torch.arange(n)).all())  # same rank file
    assert inter.draft_to_target[n + 5] == -1  # reserved fillers are not matched
    assert inter.size == n + 23
    # exact output distribution equals p over the whole (1280-token) vocabulary
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(2.0 * torch.randn(n + 256, generator=gen, dtype=torch.float64), 0)
    qd = torch.softmax(2.0 * torch.randn(n + 256, generator=gen, dtype=torch.float64), 0)
    q = inter.map_probs(qd[None])[0]
    assert torch.allclose(one_step_output_distribution(p, q, q), p, atol=1e-12)


def test_tli_beats_unmapped_draft(tmp_path):
    """Draft and target share most tokens but at different ids (a BPE trained on
    a corpus with perturbed word frequencies): mapping through the intersection keeps
    the acceptance; reading draft ids as target ids loses most of it."""
    n = 1024
    t = write_kimi_tokenizer(tmp_path / "t", n_ranks=n, seed=0)
    d = write_kimi_tokenizer(tmp_path / "d", n_ranks=n, seed=1)
    inter = intersection_from_tokenizer_dirs(d, t)
    vt, vd = inter.target_vocab_size, inter.draft_vocab_size
    assert inter.size > 0.8 * n  # most tokens are shared ...
    # ... but, beyond the 256 single bytes, hardly any keeps its id
    same_id = int((inter.draft_to_target[256:n] == torch.arange(256, n)).sum())
    assert same_id < 0.1 * (n - 256)

    gen = torch.Generator().manual_seed(11)
    rows = 64
    # target: peaked distributions over merged (multi-byte) tokens
    logits = torch.full((rows, vt), -30.0, dtype=torch.float64)
    logits[:, 256:n] = 3.0 * torch.randn(rows, n - 256, generator=gen, dtype=torch.float64)
    p = torch.softmax(logits, dim=-1)
    # a good draft: p seen through the draft's ids, with noise and 10 % stray mass
    shared_d = inter.shared_draft_ids
    qd = torch.zeros(rows, vd, dtype=torch.float64)
    noise = torch.exp(0.3 * torch.randn(rows, shared_d.numel(), generator=gen, dtype=torch.float64))
    qd[:, shared_d] = p[:, inter.draft_to_target[shared_d]] * noise
    qd = 0.9 * qd / qd.sum(-1, keepdim=True) + 0.1 / vd

    q_tli = inter.map_probs(qd)
    q_unmapped = torch.zeros(rows, vt, dtype=torch.float64)
    q_unmapped[:, : min(vd, vt)] = qd[:, : min(vd, vt)]  # draft ids used as target ids
    acc_tli = float(expected_acceptance(p, q_tli).mean())
    acc_unmapped = float(expected_acceptance(p, q_unmapped).mean())
    assert acc_tli > 0.7
    assert acc_tli > acc_unmapped + 0.3, (acc_tli, acc_unmapped)

    # and the TLI q remains lossless (exact one-step distribution) on every row
    for r in range(4):
        out = one_step_output_distribution(p[r], q_tli[r], q_tli[r])
        assert torch.allclose(out, p[r], atol=1e-12)

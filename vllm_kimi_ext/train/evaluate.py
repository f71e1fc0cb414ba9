"""Teacher-forced acceptance of a draft on captured data (``draft eval``).

For every response position the draft is run exactly as speculators trains it (the
target's hidden states, the target's tokens as draft inputs at depths > 1, its own
hidden states carried across depths), and its distribution ``q_j`` at depth
``j = 1..k`` is compared with the target's ``p`` for the same token, computed from
the captured last-layer state with the target's own final norm and full ``lm_head``:

* ``alpha_j = sum_x min(p(x), q_j(x))``: the probability that rejection sampling at
  temperature 1 accepts the draft's token (a reduced draft vocabulary puts ``q`` on
  its ids only, through ``d2t``; ``p`` keeps the full vocabulary);
* ``tau = 1 + sum_{m=1..k} prod_{j<=m} alpha_j`` per chain start, averaged: the
  expected tokens per target step at ``k`` when every draft proposes from the
  target's own continuation (teacher forcing; in serving, an accepted token is drawn
  from ``min(p, q)`` rather than the target's sample, so this is an estimate);
* greedy drafting (vLLM 0.34.0's default, ``draft_sample_method: "greedy"``) against
  a target sampled at T = 1: the draft proposes ``x = argmax q_j``, accepted with
  probability ``p(x)`` (:func:`greedy_draft_acceptance`), and its ``tau``;
* greedy decoding (T = 0): ``a_j = [argmax q_j == argmax p]`` and its ``tau``.

Chains are counted where all ``k`` predicted tokens are response tokens.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from . import bridge, layout, runstate, trainer
from .layout import DataError, Sample
from .settings import Evaluation


@dataclasses.dataclass
class Acceptance:
    """Sums over chains; :meth:`row` gives the means."""

    k: int
    chains: int = 0
    alpha: list[float] = dataclasses.field(default_factory=list)
    tau: float = 0.0
    greedy: list[float] = dataclasses.field(default_factory=list)
    greedy_tau: float = 0.0
    #: greedy drafting (vLLM 0.34.0's default draft_sample_method) against a target
    #: sampled at T = 1: the argmax draft token is accepted with probability p(x)
    greedy_draft: list[float] = dataclasses.field(default_factory=list)
    greedy_draft_tau: float = 0.0
    samples_cut: int = 0
    tokens_dropped: int = 0
    loss_tokens_dropped: int = 0

    def __post_init__(self):
        self.alpha = self.alpha or [0.0] * self.k
        self.greedy = self.greedy or [0.0] * self.k
        self.greedy_draft = self.greedy_draft or [0.0] * self.k

    def add(self, alpha, greedy, greedy_draft=None) -> None:
        """``[chains, k]`` tensors of per-depth acceptance: ``alpha`` (probabilistic
        drafting, T = 1), ``greedy`` (argmax agreement, T = 0), ``greedy_draft``
        (greedy drafting, T = 1)."""
        import torch

        if alpha.numel() == 0:
            return
        self.chains += alpha.shape[0]
        for j in range(self.k):
            self.alpha[j] += float(alpha[:, j].sum())
            self.greedy[j] += float(greedy[:, j].sum())
            if greedy_draft is not None:
                self.greedy_draft[j] += float(greedy_draft[:, j].sum())
        self.tau += float(chain_tau(alpha).sum())
        self.greedy_tau += float(chain_tau(greedy.to(torch.float64)).sum())
        if greedy_draft is not None:
            self.greedy_draft_tau += float(chain_tau(greedy_draft).sum())

    def count_cut(self, sample: Sample, max_len: int) -> None:
        """Count what ``max_len`` drops of ``sample`` (the end of its response)."""
        over = sample.num_tokens - max_len
        if over > 0:
            self.samples_cut += 1
            self.tokens_dropped += over
            self.loss_tokens_dropped += sample.loss_tokens_after(max_len)

    def merge(self, other: Acceptance) -> None:
        self.samples_cut += other.samples_cut
        self.tokens_dropped += other.tokens_dropped
        self.loss_tokens_dropped += other.loss_tokens_dropped
        self.chains += other.chains
        self.tau += other.tau
        self.greedy_tau += other.greedy_tau
        self.greedy_draft_tau += other.greedy_draft_tau
        for j in range(self.k):
            self.alpha[j] += other.alpha[j]
            self.greedy[j] += other.greedy[j]
            self.greedy_draft[j] += other.greedy_draft[j]

    def row(self) -> dict:
        n = max(self.chains, 1)
        return {"chains": self.chains, "alpha": [a / n for a in self.alpha], "tau": self.tau / n,
                "greedy_alpha": [a / n for a in self.greedy], "greedy_tau": self.greedy_tau / n,
                "greedy_draft_alpha": [a / n for a in self.greedy_draft],
                "greedy_draft_tau": self.greedy_draft_tau / n,
                "samples_cut": self.samples_cut, "tokens_dropped": self.tokens_dropped,
                "loss_tokens_dropped": self.loss_tokens_dropped}


def chain_tau(alpha):
    """``1 + sum_m prod_{j<=m} alpha_j`` per row of ``[chains, k]``."""
    import torch

    return 1.0 + torch.cumprod(alpha.to(torch.float64), dim=1).sum(dim=1)


def sum_min(p, q_draft, d2t=None):
    """``sum_x min(p(x), q(x))`` per row: ``p`` ``[n, V]``, ``q_draft`` ``[n, Vd]`` over the
    draft ids (``d2t`` maps draft id i to target id ``i + d2t[i]``; ``None``: Vd = V)."""
    import torch

    if d2t is None:
        return torch.minimum(p, q_draft).sum(-1)
    ids = torch.arange(q_draft.shape[-1], device=q_draft.device) + d2t.to(q_draft.device)
    return torch.minimum(p[:, ids], q_draft).sum(-1)


def chain_acceptance(p, qs: Sequence, valid, d2t=None):
    """Per-chain acceptance for draft depths ``qs[j]`` (``[T, Vd]`` probabilities, start
    ``i`` predicting the token ``p[i + j]`` predicts). ``valid[i]``: chain ``i`` counts.
    Returns ``(alpha, greedy)``, each ``[chains, k]``."""
    import torch

    k = len(qs)
    n = p.shape[0] - (k - 1)
    if n <= 0:
        empty = torch.zeros(0, k, dtype=torch.float64)
        return empty, empty
    starts = torch.nonzero(valid[:n]).flatten()
    alpha = torch.zeros(len(starts), k, dtype=torch.float64)
    greedy = torch.zeros(len(starts), k, dtype=torch.float64)
    target_argmax = p.argmax(-1)
    for j, q in enumerate(qs):
        pj = p[starts + j]
        qj = q[starts]
        alpha[:, j] = sum_min(pj, qj, d2t).to(torch.float64).cpu()
        draft_argmax = qj.argmax(-1)
        if d2t is not None:
            draft_argmax = draft_argmax + d2t.to(draft_argmax.device)[draft_argmax]
        greedy[:, j] = (draft_argmax == target_argmax[starts + j]).to(torch.float64).cpu()
    return alpha, greedy


def greedy_draft_acceptance(p, qs: Sequence, valid, d2t=None):
    """Per-chain acceptance when the draft proposes its argmax (vLLM's default
    ``draft_sample_method: greedy``) and the target samples at T = 1: rejection
    sampling with a one-hot draft accepts token x with probability ``p(x)``.
    ``[chains, k]``, the chains of :func:`chain_acceptance`."""
    import torch

    k = len(qs)
    n = p.shape[0] - (k - 1)
    if n <= 0:
        return torch.zeros(0, k, dtype=torch.float64)
    starts = torch.nonzero(valid[:n]).flatten()
    out = torch.zeros(len(starts), k, dtype=torch.float64)
    for j, q in enumerate(qs):
        x = q[starts].argmax(-1)
        if d2t is not None:
            x = x + d2t.to(x.device)[x]
        out[:, j] = p[starts + j].gather(-1, x[:, None])[:, 0].to(torch.float64).cpu()
    return out


def _target_head(target_dir: Path):
    from speculators.utils.loading import load_model_layers

    w = load_model_layers(["embed_tokens.weight", "lm_head.weight"], str(target_dir))
    return w.get("lm_head.weight", w["embed_tokens.weight"])


def chain_starts(loss_mask: Sequence[int], n: int, k: int) -> list[int]:
    """Shifted positions ``i`` whose chain counts: its ``k`` predicted tokens
    ``i + 2 .. i + 1 + k`` all exist (``< n``, the evaluated window) and are response
    tokens. A window shorter than ``k + 2`` tokens has none."""
    return [i for i in range(max(0, n - k - 1)) if all(loss_mask[i + 2: i + 2 + k])]


def countable_chains(samples: Sequence[Sample], k: int, max_len: int) -> int:
    """Chains :func:`evaluate` would score over ``samples`` (read without the model)."""
    return sum(len(chain_starts(s.loss_mask, min(s.num_tokens, max_len), k))
               for s in samples)


def peak_bytes(chunk: int, vocab: int) -> int:
    """The scoring's peak beyond the draft's own forward: about four fp32 ``[chunk,
    vocab]`` tensors alive at once (the target's logits, their fp32 copy, ``p`` and
    ``min(p, q)``), whatever the sample's length."""
    return 4 * 4 * chunk * vocab


def _capture_input():
    """A module to stand in for the draft's ``lm_head`` during its forward: it keeps
    each depth's input (``[1, T, hidden]``, in ``.inputs``) and returns one zero logit
    per position, so the forward never holds ``[T, vocab]`` logits (teacher forcing
    feeds the target's tokens, not the draft's argmax, to the next depth)."""
    import torch

    class CaptureInput(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inputs: list = []

        def forward(self, x):
            self.inputs.append(x.detach())
            return x.new_zeros(*x.shape[:-1], 1)

    return CaptureInput()


def evaluate(
    data_dir: str | Path,
    target_dir: str | Path,
    draft: str | Path | object,
    *,
    samples: Sequence[Sample] | None = None,
    k: int = Evaluation.k,
    max_len: int = Evaluation.max_len,
    chunk: int = Evaluation.chunk,
    progress: bool | None = None,
    device: str | None = None,
    trust_remote_code: bool = False,
) -> dict[str, dict]:
    """Acceptance of ``draft`` (a directory, or a speculators model) per source and
    ``"all"`` over ``samples`` (default: every captured sample).

    Samples longer than ``max_len`` tokens are cut; each row counts what was cut
    (``samples_cut``, ``tokens_dropped``, ``loss_tokens_dropped``). Positions are
    scored ``chunk`` chain starts at a time (:func:`peak_bytes`). On CUDA (the default
    when present) the draft and the target's head run in bf16 and the probabilities
    are taken in fp32; on CPU everything is fp32. Refuses when no chain can be scored
    (every sample shorter than ``k + 2`` tokens or without ``k`` response tokens in a
    row)."""
    import torch
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import CollateFn
    from tqdm import tqdm

    bridge.require_speculators()
    cap = trainer.capture_settings(data_dir)
    if samples is None:
        samples = trainer.captured_samples(data_dir, layout.read_samples(data_dir, tokens=False),
                                           cap, what="eval")
    if not samples:
        raise DataError(f"{data_dir}: no captured samples to evaluate on")
    check_chains(samples, k, max_len)
    dev = runstate.resolve_device(device)
    wdtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model, head = _load_checked(target_dir, draft, cap, k, trust_remote_code, dev, wdtype)
    d2t = model.d2t if getattr(model, "use_draft_vocab", False) else None
    lc = trainer.loss_config(dev)
    dataset = trainer.make_dataset(data_dir, samples, max_len, wdtype)
    per_source: dict[str, Acceptance] = defaultdict(lambda: Acceptance(k))
    draft_head, capture = model.lm_head, _capture_input()
    model.lm_head = capture
    try:
        for idx in tqdm(range(len(samples)), desc="eval", unit="sample",
                        disable=None if progress is None else not progress):
            s = samples[idx]
            n = min(s.num_tokens, max_len)
            acc = per_source[s.source or "data"]
            acc.count_cut(s, max_len)
            starts = chain_starts(s.loss_mask[:n], n, k)
            if not starts:  # too short for a chain of k: nothing to score (nor to run)
                continue
            batch = CollateFn(n, cap["hidden_size"], num_target_layers=len(cap["aux_layer_ids"]),
                              dtype=wdtype, preprocess=shift_batch)([dataset[idx]])
            inputs = trainer.model_inputs(batch, dev)
            inputs.pop("verifier_last_hidden_states")  # no loss: its [T, vocab] targets
            capture.inputs.clear()
            with torch.no_grad():
                model(**inputs, ttt_steps=k, loss_config=lc)
                last = model.verifier_norm(batch["verifier_last_hidden_states"][0].to(dev))
                hidden = [h[0] for h in capture.inputs[:k]]
                for c in range(0, len(starts), chunk):
                    rows = torch.tensor(starts[c:c + chunk], device=dev)
                    acc.add(*_score(rows, last, head, hidden, draft_head, d2t))
    finally:
        model.lm_head = draft_head
    total = Acceptance(k)
    for acc in per_source.values():
        total.merge(acc)
    rows = {name: acc.row() for name, acc in sorted(per_source.items())}
    rows["all"] = total.row()
    return rows


def check_chains(samples: Sequence[Sample], k: int, max_len: int) -> None:
    """Refuse an evaluation that would score no chain (tau is >= 1 by definition; 0
    chains would print tau 0)."""
    if countable_chains(samples, k, max_len):
        return
    longest = max((min(s.num_tokens, max_len) for s in samples), default=0)
    raise DataError(
        f"-k {k} --max-len {max_len}: no chain of {k} response tokens fits any of the "
        f"{len(samples)} samples (a chain needs k + 2 = {k + 2} tokens and k response tokens "
        f"in a row; the longest evaluated window is {longest} tokens); nothing evaluated "
        "(lower -k or raise --max-len)", field="-k")


def _score(rows, last, head, hidden, draft_head, d2t):
    """``(alpha, greedy, greedy_draft)``, each ``[len(rows), k]``, for the chains starting
    at ``rows``: depth ``j`` compares the draft's ``q_j`` at the start with the target's
    ``p`` ``j`` positions later, both computed for these rows only."""
    import torch

    k = len(hidden)
    alpha = torch.zeros(len(rows), k, dtype=torch.float64)
    greedy = torch.zeros_like(alpha)
    greedy_draft = torch.zeros_like(alpha)
    for j in range(k):
        p = torch.softmax((last[rows + j] @ head.T).float(), dim=-1)
        q = torch.softmax(draft_head(hidden[j][rows]).float(), dim=-1)
        alpha[:, j] = sum_min(p, q, d2t).to(torch.float64).cpu()
        x = q.argmax(-1)
        if d2t is not None:
            x = x + d2t.to(x.device)[x]
        greedy[:, j] = (x == p.argmax(-1)).to(torch.float64).cpu()
        greedy_draft[:, j] = p.gather(-1, x[:, None])[:, 0].to(torch.float64).cpu()
        del p, q
    return alpha, greedy, greedy_draft


def _load_checked(target_dir, draft, cap: dict, k: int, trust_remote_code: bool, dev, wdtype):
    """The draft (built from a directory, or as given) and the target's head, both refused
    when they hold NaN or infinities, then moved to ``dev`` in ``wdtype``."""
    import torch

    model = draft if not isinstance(draft, (str, Path)) else bridge.build_draft(
        target_dir, cap["aux_layer_ids"], init=draft, ttt_steps=k,
        options=bridge.DraftOptions(trust_remote_code=trust_remote_code))
    bad = trainer.first_non_finite(model)
    if bad is not None:
        raise DataError(f"--draft {draft}: tensor {bad} (or the target's head it loads) holds "
                        "NaN or infinite values")
    head = _target_head(Path(target_dir))
    if not bool(torch.isfinite(head).all()):
        raise DataError(f"--target {target_dir}: lm_head (or embed_tokens) weights hold NaN or "
                        "infinite values")
    return model.to(dev, dtype=wdtype).eval(), head.to(dev, dtype=wdtype)


def format_table(results: dict[str, dict[str, dict]], k: int = Evaluation.k) -> str:
    """Markdown: one row per (draft, source)."""
    head = ("| draft | prompts | chains | " + " | ".join(f"α{j + 1}" for j in range(k)) +
            f" | τ probabilistic draft (k={k}, T=1) | τ greedy draft (T=1, vLLM default) "
            "| τ greedy (T=0) |")
    lines = [head, "|" + "---|" * (k + 6)]
    for draft, rows in results.items():
        for source, r in rows.items():
            lines.append(f"| {draft} | {source} | {r['chains']} | " +
                         " | ".join(f"{a:.3f}" for a in r["alpha"]) +
                         f" | {r['tau']:.3f} | {r.get('greedy_draft_tau', float('nan')):.3f} "
                         f"| {r['greedy_tau']:.3f} |")
    return "\n".join(lines)

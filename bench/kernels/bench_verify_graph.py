#!/usr/bin/env python3
"""The graph-captured sharded verification step against vLLM 0.34.0's graph-captured
verify step and against vLLM's batch-sharded sampling, per rank on one GPU
(V = 163840, TP = 8, k in {3, 7}).

    python bench/kernels/bench_verify_graph.py [--vllm-src DIR] [--logits ROWS.pt]
        [--out-dir DIR] [--name NAME] [--quick] [--rounds N] [--per-graph N]
        [--rows 4,16] [--ks 3] [--modes greedy,top_p_T1] [--escalation both|split|hist|folded]
    python bench/kernels/bench_verify_graph.py --dry-run --out-dir DIR   # CPU, no timing

``ROWS.pt``: bf16 logits rows of a real model (``bench/topp_fallback.py
--save-logits``), embedded at Kimi width (real ids first, then a tail of low
logits); without it, synthetic rows (a heavy-tailed softmax) are used and the
report says so.

Modes: ``top_p_T1`` (T = 1.0, top_p 0.95: Kimi's thinking mode), ``top_p_T0.6``
(instant mode), ``greedy``, ``topk_minp`` (T = 1.0, top_k 50, min_p 0.05).

* ``ours``: rank 0's :class:`vllm_kimi_ext.verify.graph_step.GraphVerifyStep`
  (Triton) captured in one CUDA graph; every all-gather replaced by a copy of the
  bytes the 8 simulated ranks exchanged for that input (recorded eagerly first),
  so the merges are the real ones and communication itself is not timed.
  ``--escalation both`` (the default) also times the step with the escalation kernel it
  had before the split one (one program per row), when the code still has it; the
  report says why when it does not. ``--escalation split`` times the whole-row (split)
  escalation alone, ``--escalation hist`` the test kit's histogram escalation (three small
  all-gathers, ``testkit/verify_hist_step.py``, not shipped) in its place; the plan's
  escalation is in each case's ``plan``. ``--escalation folded`` times the folded escalation
  (``StepPlan.escalation == "folded"``: further candidates and one whole-row slot in one
  small all-gather, ``verify/escalate/folded.py``; at one request it is the whole-row plan)
  as ``ours`` and, side by side in the same alternating rounds, the whole-row step as
  ``ours_rows`` (its bytes in ``ours_rows_bytes_sent``; ``ours_rows_equals_ours``: the same
  tokens, a request the folded step deferred emitting a prefix of them).
* ``vllm``: what every rank runs after today's full logits all-gather, captured in
  one CUDA graph, making the decisions vLLM's ``RejectionSampler._verify`` and
  ``Sampler.apply_sampling_params`` make for these sampling parameters: the float32
  copy only when a request needs processing (not for greedy), temperature only when
  T is neither 0 nor 1, vLLM's min-p and top-k/top-p Triton kernels with the
  per-row parameters gathered as vLLM gathers them, and ``rejection_sample`` told to
  skip masked vocabulary blocks when a cut can mask logits.
* ``batch_sharded``: vLLM's ``--enable-batch-sharded-sampling`` work of the busiest
  rank for the same rows (``_batch_shard_vllm.py``): the shard plan, the permute
  after the all-to-all, the same verify on the rows of the requests it owns
  (request i -> rank i mod 8), and the packed-output gather, all vLLM's code, the
  two collectives replaced by copies of the received bytes.

Each case also records ``bytes_per_rank``: the collectives of one verify step per rank
for ours, stock vLLM's logits all-gather and batch-sharded sampling (all-to-all +
output all-gather), so the cost model can price them on PCIe.

Not timed on any side: the ``lm_head`` matmul (the same on every path) and the two
small kernels vLLM's rejection sampler runs around the verify on both of its paths
(``gather_draft_sampled``, ``get_num_sampled_and_rejected``); batch-sharded's host-side
plan (numpy) is not part of a graph replay either.

Also, on the real rows: how often round 1 leaves a cut uncertified (the escalation
round's work) and how often a row would be deferred, per mode; and correctness:
our captured step equals the eager step and the full-logits reference, the old
escalation's tokens equal the new one's, and the batch-sharded rank's tokens equal
vLLM's full-batch step's for the requests it owns.

``--dry-run`` needs no GPU: a tiny vocabulary (V = 4096), the torch backend, the same
cases, correctness checks and byte counts, nothing timed (every time ``null``); with
vLLM's source files it also loads vLLM's modules as the GPU run does. It writes the
report and checks it against ``_verify_graph_schema.py``, as every run does.

Exit status: 0 clean (also without a CUDA device: nothing to do); 1 a case failed a
check or raised (the report is still written, with the error); 2 usage error or
unreadable input (one line on stderr, ``--debug`` adds the traceback).

vLLM's source files it needs (with ``--vllm-src`` or ``.vllm_src/``): :func:`vllm_files`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import itertools
import json
import os
import re
import statistics
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))

import torch
from _batch_shard_vllm import (  # noqa: E402
    VLLM_BATCH_SHARD_FILES,
    BatchShardedRank,
    load_batch_shard,
    ours_traffic,
    owned_rows,
    traffic,
)
from _cuda_timing import time_graph  # noqa: E402
from _verify_graph_schema import problems  # noqa: E402
from _vllm_kernels import (  # noqa: E402
    TP,
    VLLM_FILES,
    VLLM_TOPP_FILES,
    V,
    load_vllm_rejection_sample,
    load_vllm_top_k_top_p,
    provenance,
)

from bench.harness.cli import (  # noqa: E402
    EXIT_FINDINGS,
    EXIT_OK,
    ArgumentParser,
    UsageError,
    add_debug,
    int_list,
    positive_int,
    run_cli,
)

PROG = "bench_verify_graph"
ROWS = (4, 16, 64, 256)
KS = (3, 7)
MODES = {
    "top_p_T1": {"temperature": 1.0, "top_p": 0.95, "top_k": 0, "min_p": 0.0},
    "top_p_T0.6": {"temperature": 0.6, "top_p": 0.95, "top_k": 0, "min_p": 0.0},
    "greedy": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0},
    "topk_minp": {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "min_p": 0.05},
}
ESCALATIONS = ("both", "split", "hist", "folded")
DRY_VLLM_NOTE = ("vLLM's kernels (rejection_sample, the batch shard plan, pack and unpack) "
                 "run by Triton's interpreter on CPU for the modes without top-k/top-p; "
                 "vLLM's top-k/top-p kernel does not run under the interpreter")
#: The dry run's vocabulary: 8 shards of 512 (small enough for the torch backend on CPU).
DRY_V = 4096
MAX_ROWS, MAX_K = 4096, 15
VLLM_GRAPH_FILES = ("vllm/v1/worker/gpu/sample/min_p.py",)
NAME_RE = re.compile(r"[A-Za-z0-9._-]+")


def vllm_files() -> tuple[str, ...]:
    """Every vLLM 0.34.0 source file this benchmark loads (relative to the sdist root)."""
    return tuple(dict.fromkeys(VLLM_FILES + VLLM_TOPP_FILES + VLLM_GRAPH_FILES
                               + VLLM_BATCH_SHARD_FILES))


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
def synthetic_rows(n: int, gen: torch.Generator, width: int = 49152) -> torch.Tensor:
    """Heavy-tailed rows (a Zipf-like head over ``width`` ids), bf16."""
    rank = torch.arange(1, width + 1).float()
    base = -1.1 * torch.log(rank)
    z = base[None, :] * (0.5 + torch.rand(n, 1, generator=gen)) * 3
    z = z + torch.randn(n, width, generator=gen) * 0.5
    perm = torch.randperm(width, generator=gen)
    return z[:, perm].to(torch.bfloat16)


def kimi_rows(real: torch.Tensor, gen: torch.Generator, vocab: int = V) -> torch.Tensor:
    n, v = real.shape
    tail = real.float().min(dim=1, keepdim=True).values - 4 + torch.randn(
        n, vocab - v, generator=gen) * 0.3
    return torch.cat([real.float(), tail], dim=1).to(torch.bfloat16)


def make_batch(z: torch.Tensor, k: int, mode: dict, gen: torch.Generator):
    from vllm_kimi_ext.verify import VerifyBatch

    n = z.shape[0] // (k + 1)
    zz = z[: n * (k + 1)].float().cpu()
    t = mode["temperature"]
    probs = torch.softmax(zz / (t if t > 0 else 1.0), dim=1)
    sampled = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    pick = torch.where(torch.rand(zz.shape[0], generator=gen) < 0.5, zz.argmax(dim=1), sampled)
    drafts = pick.view(n, k + 1)[:, :k]
    seeds = torch.randint(0, 2**62, (n,), generator=gen)
    b = VerifyBatch.from_draft_tokens(
        drafts, [t] * n, seeds, device=z.device, top_p=[mode["top_p"]] * n,
        top_k=[mode["top_k"]] * n, min_p=[mode["min_p"]] * n,
        positions=(500 + torch.arange(k + 1)).repeat(n))
    return b, drafts, seeds


# ---------------------------------------------------------------------------------------------
# vLLM's verify step (after the logits are on the rank)
# ---------------------------------------------------------------------------------------------
class VllmVerify:
    """``RejectionSampler._verify`` for one mode, as vLLM 0.34.0 decides it: per-request
    state arrays indexed through ``idx_mapping`` (``SamplingStates``), the float32 copy
    only when ``add_request`` says the request needs processing, temperature only when it
    is neither 0 nor 1, min-p / top-k / top-p with the per-row values gathered per step
    (``get_top_k_top_p``), and ``skip_masked_vocab_blocks`` when a cut may mask logits
    (``masks_logits``)."""

    def __init__(self, kern: dict, mode: dict, k: int, drafts: torch.Tensor,
                 seeds: torch.Tensor, vocab: int, dev):
        n = drafts.shape[0]
        self.kern, self.k, self.vocab = kern, k, vocab
        t, top_k, top_p, min_p = (mode["temperature"], mode["top_k"], mode["top_p"],
                                  mode["min_p"])
        self.t, self.top_k_on, self.top_p_on, self.min_p_on = t, top_k > 0, top_p < 1, min_p > 0
        f32 = dict(dtype=torch.float32, device=dev)
        self.temperature = torch.full((n,), t, **f32)
        self.seed = seeds.to(dev).to(torch.int64)
        self.top_p = torch.full((n,), top_p, **f32)
        self.top_k = torch.full((n,), top_k if top_k > 0 else vocab, dtype=torch.int32,
                                device=dev)
        self.min_p = torch.full((n,), min_p, **f32)
        cut = self.top_k_on or self.top_p_on or self.min_p_on
        self.needs_processing = t != 0.0 and (t != 1.0 or cut)
        self.masks_logits = t != 0.0 and cut
        prev = torch.full((n, 1), 7, dtype=torch.int64, device=dev)
        self.draft_sampled = torch.cat([prev, drafts.to(dev)], dim=1).reshape(-1).contiguous()
        self.pos = (1000 + torch.arange(k + 1, device=dev)).repeat(n).to(torch.int64)

    def kwargs(self, rows, idx_mapping, cu, expanded_idx_mapping, expanded_local_pos) -> dict:
        return {"draft_sampled": self.draft_sampled[rows].contiguous(),
                "pos": self.pos[rows].contiguous(), "cu_num_logits": cu,
                "idx_mapping": idx_mapping, "expanded_idx_mapping": expanded_idx_mapping,
                "expanded_local_pos": expanded_local_pos}

    def full_kwargs(self) -> dict:
        n, k, dev = self.seed.shape[0], self.k, self.seed.device
        reqs = torch.arange(n, dtype=torch.int32, device=dev)
        return self.kwargs(torch.arange(n * (k + 1), device=dev), reqs,
                           torch.arange(0, n * (k + 1) + 1, k + 1, dtype=torch.int32,
                                        device=dev),
                           reqs.repeat_interleave(k + 1),
                           torch.arange(k + 1, dtype=torch.int32, device=dev).repeat(n))

    def __call__(self, logits: torch.Tensor, kw: dict):
        x, eim = logits, kw["expanded_idx_mapping"]
        if self.needs_processing:
            x = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
            if self.t not in (0.0, 1.0):
                self.kern["temperature"](x, eim, self.temperature)
            if self.min_p_on:
                self.kern["min_p"](x, eim, self.min_p)
            if self.top_k_on or self.top_p_on:
                x = self.kern["top_k_top_p"](
                    x, self.top_k[eim] if self.top_k_on else None,
                    self.top_p[eim] if self.top_p_on else None,
                    has_topp_only_rows=self.top_p_on and not self.top_k_on)
        return self.kern["rejection_sample"](
            x, draft_logits_cache=None, temperature=self.temperature, seed=self.seed,
            num_speculative_steps=self.k, skip_masked_vocab_blocks=self.masks_logits, **kw)


def load_vllm(src: Path | None, from_source: bool = False) -> tuple[dict, dict]:
    """vLLM's kernels and the batch-shard module: ``(kern, info)``; raises with a reason.
    ``from_source``: load the source files even where a vLLM is installed (a CPU machine's
    installed vLLM has no Triton kernels; the dry run runs the source's under Triton's
    interpreter)."""
    if from_source:
        sys.modules["vllm"] = None  # makes `import vllm` fail: the loader takes the files
    rej, vinfo = load_vllm_rejection_sample(src)
    installed = vinfo.get("how") == "installed vllm"
    topk_topp, apply_temp, tinfo = load_vllm_top_k_top_p(src, installed)
    min_p = importlib.import_module("vllm.v1.worker.gpu.sample.min_p").apply_min_p
    bs, binfo = load_batch_shard(src, installed)
    kern = {"rejection_sample": rej, "top_k_top_p": topk_topp, "temperature": apply_temp,
            "min_p": min_p, "batch_shard": bs}
    return kern, {**vinfo, "top_k_top_p": tinfo, "batch_shard": binfo}


# ---------------------------------------------------------------------------------------------
# our step
# ---------------------------------------------------------------------------------------------
class Replay:
    """An all-gather stand-in that returns recorded bytes (a device copy: graph-safe)."""

    def __init__(self, recorded: list[torch.Tensor]):
        self.bufs = [r.clone() for r in recorded]
        self.src = [r.clone() for r in recorded]
        self.i = 0

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        j = self.i % len(self.bufs)
        self.i += 1
        return self.bufs[j].copy_(self.src[j])


def old_escalation(step) -> str | None:
    """Switch ``step`` to the escalation kernel of one program per row; None when done,
    else why not. Fail closed, as it reads our own step's internals (which may move): the
    step must keep its split-escalation scratch in ``_escalation_scratch`` and hand it to
    ``escalate.rows.escalate_one_hot_triton`` as ``store``, whose ``None`` selects the old
    kernel."""
    import inspect

    rows = importlib.import_module("vllm_kimi_ext.verify.escalate.rows")
    fn = getattr(rows, "escalate_one_hot_triton", None)
    store = inspect.signature(fn).parameters.get("store") if fn is not None else None
    if (not hasattr(step, "_escalation_scratch") or store is None or store.default is not None
            or "scratch=self._escalation_scratch" not in inspect.getsource(type(step))):
        return ("not available in this code: GraphVerifyStep has no switch back to the "
                "one-program-per-row escalation")
    step._escalation_scratch = None
    return None


def ours_case(z, b, vocab: int, backend: str, old: bool, escalation: str = "rows"):
    """``(plan, out, call, same_eager, same_graph, old_call, old_same, old_why)``;
    ``escalation``: the plan's (``"rows"``: whole rows, the split kernel; ``"hist"``;
    ``"folded"``)."""
    from testkit.verify_graph_sim import simulate_graph_step
    from testkit.verify_hist_step import HistVerifyStep
    from vllm_kimi_ext.verify.graph_step import GraphVerifyStep
    from vllm_kimi_ext.verify.step_io import StepInputs

    step_cls = HistVerifyStep if escalation == "hist" else GraphVerifyStep

    outs, group, plan = simulate_graph_step(z, b, TP, vocab, backend=backend,
                                            escalation=escalation)
    out = outs[0]
    S = -(-vocab // TP)
    shard0 = z[:, :S].contiguous()
    inp = StepInputs.from_layout(b.layout(), vocab)

    def make(switch_old: bool):
        replay = Replay(group.received[0])
        step = step_cls(vocab, TP, 0, replay, backend=backend)
        why = old_escalation(step) if switch_old else None

        def call():
            replay.i = 0
            return step.run(shard0, inp, plan)

        return call, why

    call, _ = make(False)
    eager = call()
    same_eager = torch.equal(eager.sampled, out.sampled)
    same_graph = same_eager if not z.is_cuda else _graph_equals(call, out)
    old_call = old_same = old_why = None
    if old and plan.escalation_slots:
        old_call, old_why = make(True)
        if old_why is None:
            o = old_call()
            old_same = bool(torch.equal(o.sampled, out.sampled)
                            and torch.equal(o.num_sampled, out.num_sampled))
        else:
            old_call = None
    return plan, out, call, bool(same_eager and same_graph), old_call, old_same, old_why


def rows_case(z, b, vocab: int, backend: str, out, case: dict, calls: dict) -> None:
    """The whole-row step beside the folded one: its call (timed as ``ours_rows``), bytes and
    whether its tokens equal the folded step's (a request the folded step deferred must emit a
    prefix of them)."""
    try:
        rplan, rout, rcall, rsame, *_ = ours_case(z, b, vocab, backend, False, "rows")
        same = bool(rsame)
        stopped = set(out.stopped.nonzero().squeeze(1).tolist())
        for i, (a, r) in enumerate(zip(out.sampled.tolist(), rout.sampled.tolist())):
            na, nr = int(out.num_sampled[i]), int(rout.num_sampled[i])
            same &= a[:na] == r[:nr] if i not in stopped else (na <= nr and a[:na] == r[:na])
        case.update(ours_rows_bytes_sent=int(rplan.bytes_sent_per_rank),
                    ours_rows_equals_ours=same)
        calls["ours_rows"] = rcall
    except Exception as e:  # noqa: BLE001 - reported in the case
        case["ours_rows_error"] = _error(e)


def _graph_equals(call, out) -> bool:
    """Capture ``call`` once; the replayed output equals ``out``."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gout = call()
    graph.replay()
    torch.cuda.synchronize()
    return bool(torch.equal(gout.sampled, out.sampled)
                and torch.equal(gout.num_sampled, out.num_sampled))


def reference_check(z, b, out, vocab: int) -> dict:
    from testkit.verify_equivalence import assert_equivalent
    from vllm_kimi_ext.verify import ReferenceVerifier
    from vllm_kimi_ext.verify.batch import VerifyOutput

    ref = ReferenceVerifier(vocab).verify(z, b)
    ours = VerifyOutput(out.sampled, out.num_sampled, out.accept_margin, out.nucleus_margin)
    stopped = out.stopped.nonzero().squeeze(1).tolist()
    if stopped:
        sampled, num = ours.sampled.clone(), ours.num_sampled.clone()
        rt, ot = ref.tokens(), ours.tokens()
        for i in stopped:
            assert rt[i][:len(ot[i])] == ot[i] and len(ot[i]) >= 1
            sampled[i], num[i] = ref.sampled[i], ref.num_sampled[i]
        ours = VerifyOutput(sampled, num, ours.accept_margin, ours.nucleus_margin)
    rep = assert_equivalent(ref, ours, b, logits=z, vocab_size=vocab, allow_score_ties=True)
    return {"requests": rep.num_reqs, "identical": rep.identical,
            "certified_flips": rep.certified_accept_flips,
            "score_ties": rep.certified_residual_ties,
            "deferred_requests": len(stopped)}


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def warm_gpu(seconds: float = 3.0) -> None:
    """Busy the GPU for a few seconds so the first cases run at steady clocks too."""
    import time

    a = torch.randn(4096, 4096, device="cuda")
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a = (a @ a).tanh_()
        torch.cuda.synchronize()


def alternate(calls: dict, rounds: int, per_graph: int) -> dict:
    """Time every call ``rounds`` times, alternating (a, b, c, a, b, c, ...), so a clock or
    thermal drift during the run hits all alike; each side's figure is the median of its
    per-round medians, with every round kept. One CUDA graph holds ``per_graph`` steps
    back to back and its time is divided by them: as in a server, where the verify step
    is queued behind the model's forward, the host's graph launch is not part of a step
    (a graph of one 10 µs step would time mostly the launch)."""
    runs: dict[str, list] = {name: [] for name in calls}
    errors: dict[str, str] = {}
    for _ in range(rounds):
        for name, fn in calls.items():
            if name in errors:
                continue
            try:
                runs[name].append(time_graph([fn] * per_graph))
            except Exception as e:  # noqa: BLE001 - that side is reported, the others go on
                errors[name] = _error(e)
    out: dict = {"errors": errors}
    for name, rs in runs.items():
        if name in errors:
            continue
        med = [r["median_us"] for r in rs]
        out[name] = {"median_us": statistics.median(med), "round_medians_us": med,
                     "min_us": min(r["min_us"] for r in rs), "rounds": rounds,
                     "steps_per_graph": per_graph}
    return out


# ---------------------------------------------------------------------------------------------
# one case
# ---------------------------------------------------------------------------------------------
def _error(e: BaseException) -> str:
    return "".join(traceback.format_exception(e))[-2000:]


def _tokens_equal(a_sampled, a_num, b_sampled, b_num, reqs: list[int]) -> bool:
    for i in reqs:
        n = int(a_num[i])
        if n != int(b_num[i]) or a_sampled[i, :n].tolist() != b_sampled[i, :n].tolist():
            return False
    return True


def run_case(z, k: int, mname: str, args, kern: dict | None, gen, vocab: int) -> dict:
    mode = MODES[mname]
    rows = z.shape[0]
    b, drafts, seeds = make_batch(z, k, mode, gen)
    case = {"rows": rows, "k": k, "mode": mname, "temperature": mode["temperature"],
            "top_p": mode["top_p"], "top_k": mode["top_k"], "min_p": mode["min_p"],
            "batch_sharded_rows": len(owned_rows(rows // (k + 1), k, TP, 0))}
    bpr = traffic(rows, k, vocab, TP, z.element_size())
    calls: dict = {}
    backend = "triton" if z.is_cuda else "torch"
    esc = args.escalation if args.escalation in ("hist", "folded") else "rows"
    try:
        plan, out, call, same, old_call, old_same, old_why = ours_case(
            z, b, vocab, backend, args.escalation == "both", esc)
        bpr["ours"] = ours_traffic(plan, TP)
        case.update(payload_bytes_per_row_per_rank=plan.bytes_per_row_per_rank,
                    rounds=len(plan.rounds), plan=plan.describe(),
                    uncertified_rows=int(out.uncertified.sum()),
                    deferred_rows=int(out.deferred.sum()), graph_equals_eager=same,
                    old_escalation_equals_new=old_same)
        case["reference"] = reference_check(z, b, out, vocab)
        calls["ours"] = call
        if esc == "folded" and plan.escalation_slots:
            rows_case(z, b, vocab, backend, out, case, calls)
        if old_call is not None:
            calls["ours_old_escalation"] = old_call
        elif old_why:
            args.old_escalation_why = old_why
    except Exception as e:  # noqa: BLE001 - reported in the case
        case["ours_error"] = _error(e)
    if kern is not None:
        try:
            verify = VllmVerify(kern, mode, k, drafts, seeds, vocab, z.device)
            kw = verify.full_kwargs()
            ref_sampled, ref_num = verify(z, kw)
            calls["vllm"] = lambda: verify(z, kw)
        except Exception as e:  # noqa: BLE001 - reported in the case
            case["vllm_error"] = _error(e)
        if "vllm" in calls:
            try:
                rank = BatchShardedRank(kern["batch_shard"], z, k, TP, 0, verify, verify.kwargs)
                rank.check_layout()
                o = rank()
                case["batch_sharded_equals_vllm"] = _tokens_equal(
                    o.sampled_token_ids, o.num_sampled, ref_sampled, ref_num,
                    rank.my_requests())
                calls["batch_sharded"] = rank
            except Exception as e:  # noqa: BLE001 - reported in the case
                case["batch_sharded_error"] = _error(e)
    case["bytes_per_rank"] = {**{"ours": {"collectives": 0, "sent": 0, "received": 0,
                                          "detail": "not planned (see ours_error)"}}, **bpr}
    if z.is_cuda and calls:
        t = alternate(calls, args.rounds, args.per_graph)
        for side, field, us in TIMING_FIELDS:
            if side in t:
                case[field], case[us] = t[side], t[side]["median_us"]
        for side, err in t["errors"].items():
            key = {"vllm": "vllm_error"}.get(side, f"{side}_error")
            case[key] = f"timing: {err}"
    if case.get("ours_graph_us") and case.get("vllm_graph_us"):
        case["speedup_vs_vllm"] = case["vllm_graph_us"] / case["ours_graph_us"]
    if case.get("ours_graph_us") and case.get("batch_sharded_us"):
        case["speedup_vs_batch_sharded"] = case["batch_sharded_us"] / case["ours_graph_us"]
    return case


#: (side, the case's timing record, the case's median in µs)
TIMING_FIELDS = (("ours", "ours_graph", "ours_graph_us"),
                 ("ours_old_escalation", "ours_old_escalation", "ours_old_escalation_us"),
                 ("ours_rows", "ours_rows", "ours_rows_us"),
                 ("vllm", "vllm_graph", "vllm_graph_us"),
                 ("batch_sharded", "batch_sharded_graph", "batch_sharded_us"))


ERRORS = ("ours_error", "ours_old_escalation_error", "vllm_error", "batch_sharded_error",
          "ours_rows_error")


def failed(case: dict) -> bool:
    return (any(case.get(e) for e in ERRORS)
            or any(case.get(c) is False for c in ("graph_equals_eager",
                                                  "old_escalation_equals_new",
                                                  "ours_rows_equals_ours",
                                                  "batch_sharded_equals_vllm")))


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------
def _logits_rows(args, gen, dry: bool) -> tuple[torch.Tensor, str]:
    """The rows every case samples from: ``--logits`` (a dry run keeps the first ids only,
    up to half its vocabulary) or synthetic rows over 49152 ids (a dry run: 2048)."""
    width = DRY_V // 2 if dry else None
    if args.logits:
        obj = torch.load(args.logits)
        real = (obj["logits_bf16"] if isinstance(obj, dict) else obj).to(torch.bfloat16)
        src = (f"real rows, {real.shape[0]} x {real.shape[1]} bf16"
               + (f": {obj['source']}" if isinstance(obj, dict) and "source" in obj else ""))
        if width is not None and real.shape[1] > width:
            real, src = real[:, :width], f"{src} (dry run: the first {width} ids)"
        return real, src
    return (synthetic_rows(512, gen, width or 49152),
            "synthetic heavy-tailed rows (no --logits given)")


def _dry_provenance(vinfo) -> dict:
    import datetime as _dt
    import platform

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "gpu": "none (dry run on CPU)", "sm_count": 0, "torch": torch.__version__,
            "triton": triton_version, "python": platform.python_version(), "vllm_kernel": vinfo}


def run(args) -> dict:
    dry = args.dry_run
    vocab = DRY_V if dry else V
    dev = "cpu" if dry else "cuda"
    gen = torch.Generator().manual_seed(0)
    real, source = _logits_rows(args, gen, dry)
    kern, vinfo = None, {"how": "not loaded (dry run without vLLM's source files)"}
    if dry and args.vllm_src is not None and importlib.util.find_spec("triton") is None:
        args.vllm_src, vinfo = None, {"how": "not loaded (dry run without Triton)"}
    if dry and args.vllm_src is not None:
        os.environ["TRITON_INTERPRET"] = "1"  # before vLLM's kernels are decorated
    if not dry or args.vllm_src is not None:
        kern, vinfo = load_vllm(args.vllm_src, from_source=dry)
    prov = _dry_provenance(vinfo) if dry else provenance(vinfo)
    args.old_escalation_why = None
    report = {"provenance": prov, "logits": source, "cases": [],
              "hardware": prov["gpu"],
              "setup": (f"one {'CPU (dry run, torch backend, nothing timed)' if dry else 'GPU'}"
                        f", rank 0 of TP = {TP} simulated (all-gathers replayed), "
                        f"{prov['sm_count']} SMs"),
              "versions": {"torch": prov["torch"], "triton": prov["triton"],
                           "python": prov["python"],
                           "vllm_kernels": "0.34.0 source files (unmodified)"},
              "date": prov["date_utc"], "timing_rounds": args.rounds,
              "steps_per_graph": args.per_graph, "vocab_size": vocab, "tp": TP,
              "dry_run": dry, "vllm_method": VllmVerify.__doc__.split("\n\n")[0].replace(
                  "\n    ", " ").replace("``", "`").strip()}
    if not dry:
        warm_gpu()
    for k, rows, mname in itertools.product(args.ks, args.rows, args.modes):
        if rows % (k + 1):
            continue
        idx = torch.linspace(0, real.shape[0] - 1, rows).long()
        z = kimi_rows(real[idx], gen, vocab).to(dev)
        interpretable = MODES[mname]["top_k"] == 0 and MODES[mname]["top_p"] == 1.0
        case = run_case(z, k, mname, args, kern if not dry or interpretable else None, gen,
                        vocab)
        print({x: case.get(x) for x in ("rows", "k", "mode", "ours_graph_us", "vllm_graph_us",
                                         "batch_sharded_us", "speedup_vs_vllm", "rounds",
                                         "uncertified_rows")}, flush=True)
        report["cases"].append(case)
        write_report(report, args.out_dir, args.name)  # after every case: a run stopped
        # half-way (a time limit) leaves the cases it finished
    if dry:
        report["dry_run_note"] = (
            DRY_VLLM_NOTE if kern is not None else
            f"vLLM not run: {vinfo['how']} (--vllm-src, .vllm_src/ or build/vllm-0.34.0/)")
    if args.old_escalation_why:
        report["old_escalation"] = args.old_escalation_why
    elif args.escalation == "both" and dry:
        report["old_escalation"] = "dry run: the torch backend has no escalation kernels"
    return report


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------
OLD_TIMED = "timed where a case has an escalation round"


def _f(v, fmt: str = ".1f") -> str:
    return "—" if v is None else format(v, fmt)


def markdown(report: dict) -> str:
    p = report["provenance"]
    head = ("a dry run: nothing timed, V = {v}".format(v=report["vocab_size"])
            if report["dry_run"] else f"V = {report['vocab_size']}")
    lines = ["# Graph-captured sharded verification vs vLLM 0.34.0 (one GPU, per rank)", "",
             f"{p.get('gpu', '')}; torch {p.get('torch', '')}, Triton {p.get('triton', '')}; "
             f"{p.get('date_utc', '')}. vLLM kernels: {p.get('vllm_kernel', {}).get('how', '')}."
             f" Logits: {report['logits']}, embedded at full width (real ids first, then a "
             f"tail of low logits). {head}, TP = {report['tp']} (rank 0; all-gathers replayed "
             "from the bytes 8 simulated ranks exchanged, communication not timed). Every "
             "step captured in CUDA graphs of "
             f"{report['steps_per_graph']} steps back to back (time per step: the "
             "host's graph launch is not part of a step); each time is the median of "
             f"{report['timing_rounds']} alternating rounds (ours, [ours with the old "
             "escalation,] vLLM, batch-sharded, ...) of 30 replays each, after a few seconds "
             "of GPU warm-up.", "",
             f"vLLM side: {report['vllm_method']} Batch-sharded: the busiest rank's work "
             "(shard plan, permute after the all-to-all, the same verify on the rows of the "
             "requests it owns, packed-output gather); its rows column counts those rows.",
             "", f"Old escalation: {report.get('old_escalation') or OLD_TIMED}.", "",
             "| k | rows | mode | ours (µs) | old esc. (µs) | vLLM (µs) | batch-sharded (µs) "
             "| its rows | vLLM / ours | b-s / ours | rounds | B/rank ours | B/rank gather "
             "| B/rank b-s (recv) | uncertified rows | deferred rows | graph = eager "
             "| = reference | b-s = vLLM |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
             "|---|---|---|"]
    for c in report["cases"]:
        ref = c.get("reference") or {}
        ok_ref = f"{ref.get('identical')}/{ref.get('requests')}" if ref else "—"
        b = c["bytes_per_rank"]
        lines.append(
            f"| {c['k']} | {c['rows']} | {c['mode']} | {_f(c.get('ours_graph_us'))} "
            f"| {_f(c.get('ours_old_escalation_us'))} | {_f(c.get('vllm_graph_us'))} "
            f"| {_f(c.get('batch_sharded_us'))} | {c['batch_sharded_rows']} "
            f"| {_f(c.get('speedup_vs_vllm'), '.2f')} "
            f"| {_f(c.get('speedup_vs_batch_sharded'), '.2f')} | {c.get('rounds', '—')} "
            f"| {b['ours']['sent']} | {b['vllm_logits_gather']['received']} "
            f"| {b['batch_sharded']['received']} "
            f"| {c.get('uncertified_rows', '—')} | {c.get('deferred_rows', '—')} "
            f"| {c.get('graph_equals_eager', '—')} | {ok_ref} "
            f"| {_f(c.get('batch_sharded_equals_vllm'), '')} |")
    lines += ["", "B/rank: bytes of one verify step's collectives per rank — ours: sent by "
              "each rank (each receives 7x that); gather: received by each rank in stock "
              "vLLM's logits all-gather; b-s: received by the busiest rank in batch-sharded "
              "sampling's all-to-all + output all-gather (`bytes_per_rank` in the JSON has "
              "sent, received and the collectives of each)."]
    lines += _rows_markdown(report)
    errs = [c for c in report["cases"] if failed(c)]
    if errs:
        lines += ["", "## Errors and failed checks", ""]
        for c in errs:
            what = next((c[e] for e in ERRORS if c.get(e)), "a check is false")
            lines.append(f"- k={c['k']} rows={c['rows']} {c['mode']}: {what[-400:]!r}")
    return "\n".join(lines) + "\n"


def _rows_markdown(report: dict) -> list[str]:
    """With ``--escalation folded``: the folded step (ours) beside the whole-row step."""
    cases = [c for c in report["cases"] if "ours_rows_equals_ours" in c or c.get("ours_rows_us")]
    if not cases:
        return []
    out = ["", "## Folded escalation (ours) beside the whole-row escalation", "",
           "| k | rows | mode | ours folded (µs) | ours whole rows (µs) | vLLM (µs) "
           "| batch-sharded (µs) | B/rank folded | B/rank whole rows | deferred rows "
           "| same tokens |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in cases:
        out.append(f"| {c['k']} | {c['rows']} | {c['mode']} | {_f(c.get('ours_graph_us'))} "
                   f"| {_f(c.get('ours_rows_us'))} | {_f(c.get('vllm_graph_us'))} "
                   f"| {_f(c.get('batch_sharded_us'))} | {c['bytes_per_rank']['ours']['sent']} "
                   f"| {c.get('ours_rows_bytes_sent', '—')} | {c.get('deferred_rows', '—')} "
                   f"| {c.get('ours_rows_equals_ours', '—')} |")
    return out


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_report(report: dict, out_dir: Path, name: str) -> list[str]:
    """``NAME.json`` + ``NAME.md``, each replaced whole (an interrupted run leaves the
    previous files). A report that does not match the schema is still written (measured
    times are not thrown away) with its problems under ``schema_problems``, which no reader
    accepts; they are returned."""
    report.pop("schema_problems", None)
    bad = problems(json.loads(json.dumps(report, default=str)))
    if bad:
        report["schema_problems"] = bad
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / f"{name}.json", json.dumps(report, indent=1, default=str) + "\n")
    write_atomic(out_dir / f"{name}.md", markdown(report))
    return bad


# ---------------------------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------------------------
def _choice_list(choices) -> callable:
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",")]
        bad = [x for x in items if x not in choices]
        if not items or bad:
            raise argparse.ArgumentTypeError(
                f"expected a comma list of {', '.join(choices)}, got {text!r}")
        return list(dict.fromkeys(items))

    parse.__name__ = "a comma list of modes"
    return parse


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0],
                        epilog="exit status: 0 clean (or no CUDA device); 1 a case failed a "
                               "check or raised (report written); 2 usage error or unreadable "
                               "input (one line on stderr; --debug shows the traceback)")
    ap.add_argument("--vllm-src", type=Path, default=None,
                    help="a directory holding vLLM 0.34.0's source files (vllm/...); "
                         "default: an installed vLLM, else .vllm_src/ or build/vllm-0.34.0/")
    ap.add_argument("--logits", type=Path, default=None, help="real logits rows (.pt)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out")
    ap.add_argument("--name", default="verify_graph_vs_vllm_h200",
                    help="output file stem (letters, digits, '.', '_', '-')")
    ap.add_argument("--quick", action="store_true", help="rows 4 and 16 only")
    ap.add_argument("--rounds", type=positive_int, default=3,
                    help="alternating timing rounds per case (ours, vLLM, ours, ...)")
    ap.add_argument("--per-graph", type=positive_int, default=10,
                    help="steps captured back to back in one timed CUDA graph")
    ap.add_argument("--rows", type=int_list, default=None,
                    help=f"comma list of verified row counts (default {','.join(map(str, ROWS))};"
                         f" at most {MAX_ROWS}; a row count that is not a multiple of k + 1 "
                         "is skipped for that k)")
    ap.add_argument("--ks", type=int_list, default=None,
                    help=f"comma list of draft lengths k (default {','.join(map(str, KS))}; "
                         f"at most {MAX_K})")
    ap.add_argument("--modes", type=_choice_list(tuple(MODES)), default=None,
                    help=f"comma list of modes (default all: {', '.join(MODES)})")
    ap.add_argument("--escalation", choices=ESCALATIONS, default="both",
                    help="both: also time our step with the old one-program-per-row "
                         "escalation kernel (when the code still has it); split: only the "
                         "split (whole-row) escalation; hist: the histogram escalation; "
                         "folded: the folded escalation, timed beside the whole-row step")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, V = 4096, torch backend, nothing timed: the cases, checks, "
                         "byte counts and the report's schema")
    add_debug(ap)
    return ap


def parse_args(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if not NAME_RE.fullmatch(args.name):
        raise UsageError(f"--name: expected letters, digits, '.', '_' or '-', got "
                         f"{args.name!r}")
    args.rows = args.rows or list(ROWS[:2] if args.quick else ROWS)
    args.ks = args.ks or list(KS)
    args.modes = args.modes or list(MODES)
    if max(args.rows) > MAX_ROWS:
        raise UsageError(f"--rows: expected row counts <= {MAX_ROWS}, got {max(args.rows)}")
    if max(args.ks) > MAX_K:
        raise UsageError(f"--ks: expected k <= {MAX_K}, got {max(args.ks)}")
    if not any(r % (k + 1) == 0 for r in args.rows for k in args.ks):
        raise UsageError(f"--rows {','.join(map(str, args.rows))} / --ks "
                         f"{','.join(map(str, args.ks))}: no row count is a multiple of "
                         "k + 1, nothing to run")
    if args.logits is not None and not args.logits.is_file():
        raise UsageError(f"--logits {args.logits}: no such file (expected a .pt of bf16 "
                         "logits rows from bench/topp_fallback.py --save-logits)")
    if args.out_dir.exists() and not args.out_dir.is_dir():
        raise UsageError(f"--out-dir {args.out_dir}: exists and is not a directory")
    for parent in args.out_dir.parents:
        if parent.exists() and not parent.is_dir():
            raise UsageError(f"--out-dir {args.out_dir}: {parent} is not a directory")
    if args.vllm_src is not None:
        if not args.vllm_src.is_dir():
            raise UsageError(f"--vllm-src {args.vllm_src}: not a directory (expected one "
                             "holding vllm/... source files of vLLM 0.34.0)")
        missing = [f for f in vllm_files() if not (args.vllm_src / f).is_file()]
        if missing:
            raise UsageError(f"--vllm-src {args.vllm_src}: lacks {missing[0]} (and "
                             f"{len(missing) - 1} more of the {len(vllm_files())} files "
                             "this benchmark loads)")
    else:
        args.vllm_src = default_vllm_src(args.dry_run)
    return args


def default_vllm_src(dry: bool) -> Path | None:
    """``.vllm_src/`` or ``build/vllm-0.34.0/`` when one holds every file (an installed
    vLLM wins on a GPU run; a dry run loads nothing without source files)."""
    for p in (ROOT / ".vllm_src", ROOT / "build" / "vllm-0.34.0"):
        if all((p / f).is_file() for f in vllm_files()):
            return p
    return None


def body(args: argparse.Namespace) -> int:
    if not args.dry_run and not torch.cuda.is_available():
        print(f"{PROG}: needs a CUDA device (or --dry-run); skipped")
        return EXIT_OK
    report = run(args)
    schema_bad = write_report(report, args.out_dir, args.name)  # the notes come last
    print(markdown(report))
    bad = [c for c in report["cases"] if failed(c)]
    if bad:
        print(f"{PROG}: {len(bad)} case(s) failed a check or raised (see the report's "
              "errors)", file=sys.stderr)
    if schema_bad:
        print(f"{PROG}: the report does not match _verify_graph_schema.py: {schema_bad[0]} "
              f"({len(schema_bad)} problem(s), listed under schema_problems)", file=sys.stderr)
    return EXIT_FINDINGS if bad or schema_bad else EXIT_OK


def main(argv=None) -> int:
    return run_cli(PROG, parse_args, body, argv)


if __name__ == "__main__":
    sys.exit(main())

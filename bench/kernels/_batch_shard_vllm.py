"""vLLM 0.34.0's batch-sharded sampling (``--enable-batch-sharded-sampling``,
``vllm/v1/worker/gpu/sample/batch_shard.py``), one rank of it on one GPU, for
``bench_verify_graph.py`` (not a benchmark itself: ``nox -s bench`` skips ``_`` files).

What a rank runs in ``GPUModelRunner.sample`` (``v1/worker/gpu/model_runner.py:1703-1779``)
with batch sharding on, besides the ``lm_head`` matmul (the same work on every path):

1. ``BatchSharder.shard_sampler_inputs``: host bookkeeping + ``_build_shard_plan_kernel``;
2. ``all_to_all_vocab_shards``: the all-to-all (here: a device copy of the bytes this rank
   receives, so communication itself is not timed) and its permute into full rows;
3. the rejection sampler on the rows of the requests this rank owns;
4. ``gather_sampler_output``: the pack kernel, an all-gather of the packed output (again a
   copy of the received bytes) and the unpack kernel.

Every step is vLLM's own code (the module loaded from the 0.34.0 source files under stub
parents, or the installed vLLM); the collectives are replaced through the module's own
seams (``get_tp_group`` and ``tensor_model_parallel_all_gather``). Request ownership is
vLLM's ``shard_owners`` (batch position mod TP); :func:`owned_rows` restates it for the
byte counts and the dry run, and :meth:`BatchShardedRank.check_layout` compares it with the
plan kernel's output on the GPU (fail closed: a different layout is an error, not a number).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import sys
import types
from pathlib import Path

import numpy as np
import torch

VLLM_BATCH_SHARD_FILES = (
    "vllm/v1/worker/gpu/sample/batch_shard.py",
    "vllm/v1/worker/gpu/sample/output.py",
)
#: ``max_num_seqs`` of a server on a >= 70 GiB GPU (H200, RTX PRO 6000): vLLM 0.34.0's
#: default (``engine/arg_utils.py:3019-3033``); it sizes the plan kernel's request block.
MAX_NUM_SEQS = 1024
#: int64 columns of the packed sampler output beyond the token ids (``num_sampled``,
#: ``num_rejected``; ``num_nans`` only with ``VLLM_COMPUTE_NANS_IN_LOGITS``, off by default).
PACKED_EXTRA_COLUMNS = 2
INT64_BYTES = 8


def owned_rows(num_reqs: int, k: int, tp: int, rank: int) -> list[int]:
    """Logits rows of the requests ``rank`` owns (request ``i`` -> rank ``i % tp``)."""
    return [i * (k + 1) + j for i in range(rank, num_reqs, tp) for j in range(k + 1)]


def traffic(rows: int, k: int, vocab: int, tp: int, logits_bytes: int = 2) -> dict:
    """Bytes per rank of stock vLLM's logits all-gather and of batch-sharded sampling's
    all-to-all + output all-gather, for ``rows = B (k + 1)`` verified rows."""
    shard = -(-vocab // tp) * logits_bytes  # one row's vocabulary shard
    num_reqs = rows // (k + 1)
    mine = [len(owned_rows(num_reqs, k, tp, r)) for r in range(tp)]
    packed = max(1, -(-num_reqs // tp)) * (k + 1 + PACKED_EXTRA_COLUMNS) * INT64_BYTES
    a2a_sent = max(rows - m for m in mine) * shard
    a2a_received = max(mine) * (tp - 1) * shard
    return {
        "vllm_logits_gather": {
            "collectives": 1, "sent": rows * shard, "received": (tp - 1) * rows * shard,
            "detail": f"all-gather of [{rows}, {vocab}] logits ({logits_bytes} B each)"},
        "batch_sharded": {
            "collectives": 2, "sent": a2a_sent + packed,
            "received": a2a_received + (tp - 1) * packed,
            "detail": (f"all-to-all (busiest rank receives {max(mine)} full rows, "
                       f"{a2a_received} B) + all-gather of the packed output "
                       f"({packed} B per rank)")},
    }


def ours_traffic(plan, tp: int) -> dict:
    sent = int(plan.bytes_sent_per_rank)
    return {"collectives": int(plan.num_collectives), "sent": sent,
            "received": (tp - 1) * sent, "detail": plan.describe()}


# ---------------------------------------------------------------------------------------------
# vLLM's module
# ---------------------------------------------------------------------------------------------
def load_batch_shard(src: Path | None, installed: bool):
    """``(batch_shard module, info)``; call after ``load_vllm_rejection_sample`` (which
    stubbed the parents and a placeholder ``batch_shard`` when not ``installed``)."""
    if installed:
        mod = importlib.import_module("vllm.v1.worker.gpu.sample.batch_shard")
        return mod, {"how": "installed vllm", "file": mod.__file__}
    if src is None:
        raise RuntimeError("no --vllm-src")
    root = Path(src).resolve()
    missing = [f for f in VLLM_BATCH_SHARD_FILES if not (root / f).exists()]
    if missing:
        raise RuntimeError(f"--vllm-src lacks {missing}")

    def _never(*a, **k):
        raise RuntimeError("replaced per case by the benchmark")

    from _vllm_kernels import _stub_module as _stub

    for pkg in ("vllm.v1.core", "vllm.v1.core.sched"):
        _stub(pkg).__path__ = [str(root.joinpath(*pkg.split(".")))]
    # names the modules import but the timed path never touches (type annotations,
    # the logprobs and grammar paths)
    _stub("vllm.config", VllmConfig=object)
    _stub("vllm.distributed.communication_op", tensor_model_parallel_all_gather=_never)
    _stub("vllm.v1.core.sched.output", GrammarOutput=object)
    _stub("vllm.v1.outputs", LogprobsTensors=object, SamplingMaskLists=object)
    for name in ("vllm.v1.worker.gpu.sample.batch_shard", "vllm.v1.worker.gpu.sample.output"):
        sys.modules.pop(name, None)  # the rejection-sampler loader's placeholder
    mod = importlib.import_module("vllm.v1.worker.gpu.sample.batch_shard")
    sha = {f: hashlib.sha256((root / f).read_bytes()).hexdigest()[:16]
           for f in VLLM_BATCH_SHARD_FILES}
    return mod, {"how": "unmodified 0.34.0 source files, stub parents", "sha256_16": sha}


# ---------------------------------------------------------------------------------------------
# one rank
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class InputBatchStandIn:
    """The fields of vLLM's ``InputBatch`` that ``shard_sampler_inputs`` reads and
    ``dataclasses.replace`` writes, for a decode step of ``k + 1`` tokens per request."""

    req_ids: list
    num_reqs: int
    idx_mapping: torch.Tensor
    idx_mapping_np: np.ndarray
    expanded_idx_mapping: torch.Tensor
    expanded_local_pos: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu_upper_bound: torch.Tensor
    logits_indices: torch.Tensor
    cu_num_logits: torch.Tensor
    cu_num_logits_np: np.ndarray
    query_start_loc: torch.Tensor
    num_draft_tokens: int
    num_draft_tokens_per_req: np.ndarray | None
    num_admitted_draft_tokens: object = None

    @staticmethod
    def decode(num_reqs: int, k: int, device) -> InputBatchStandIn:
        n, rows = num_reqs, num_reqs * (k + 1)
        cu = np.arange(0, rows + 1, k + 1, dtype=np.int32)
        i32 = dict(dtype=torch.int32, device=device)
        return InputBatchStandIn(
            req_ids=[f"req-{i}" for i in range(n)], num_reqs=n,
            idx_mapping=torch.arange(n, **i32), idx_mapping_np=np.arange(n, dtype=np.int32),
            expanded_idx_mapping=torch.arange(n, **i32).repeat_interleave(k + 1),
            expanded_local_pos=torch.arange(k + 1, **i32).repeat(n),
            seq_lens=torch.full((n,), 1000, **i32),
            seq_lens_cpu_upper_bound=torch.full((n,), 1000, dtype=torch.int32),
            logits_indices=torch.arange(rows, dtype=torch.int64, device=device),
            cu_num_logits=torch.from_numpy(cu).to(device), cu_num_logits_np=cu,
            query_start_loc=torch.from_numpy(cu).to(device), num_draft_tokens=n * k,
            num_draft_tokens_per_req=np.full(n, k, dtype=np.int32))


class _ReplayComm:
    """Stands in for the TP group's PyNCCL communicator: ``all_to_all_single`` writes the
    bytes this rank receives (recorded once) into vLLM's receive buffer."""

    disabled = False

    def __init__(self, received: torch.Tensor):
        self.received = received

    def all_to_all_single(self, recv, send, recv_splits, send_splits):
        recv.copy_(self.received)


class BatchShardedRank:
    """Rank ``rank`` of ``tp`` under batch-sharded sampling for the batch whose full
    logits are ``z`` ``[B (k + 1), V]``. ``sample(logits, kw)`` is the rejection sampler
    (the same vLLM chain the stock case times) and ``sample_kwargs(rows_idx, idx_mapping,
    cu, expanded_idx_mapping, expanded_local_pos)`` its per-batch arguments."""

    def __init__(self, bs, z: torch.Tensor, k: int, tp: int, rank: int, sample,
                 sample_kwargs):
        self.bs, self.k, self.tp, self.rank = bs, k, tp, rank
        rows, V = z.shape
        self.num_reqs = rows // (k + 1)
        S = -(-V // tp)
        dev = z.device
        self.batch = InputBatchStandIn.decode(self.num_reqs, k, dev)
        self.mine = owned_rows(self.num_reqs, k, tp, rank)
        n_local = len(self.mine)
        mine_t = torch.tensor(self.mine, dtype=torch.int64, device=dev)
        local_full = z.index_select(0, mine_t)
        # what the all-to-all delivers: rank r's vocabulary shard of this rank's rows
        self.received = torch.cat([local_full[:, r * S:(r + 1) * S] for r in range(tp)])
        # what this rank sends (its shard of every row, owner-sorted): only its shape matters
        order = [r for q in range(tp) for r in owned_rows(self.num_reqs, k, tp, q)]
        self.send = z[torch.tensor(order, device=dev), rank * S:(rank + 1) * S].contiguous()
        owners = np.arange(self.num_reqs) % tp
        logits_per_rank = np.bincount(owners, minlength=tp) * (k + 1)
        self.send_splits = logits_per_rank.tolist()
        self.n_local = n_local
        self.vocab = V
        self.sample = sample
        local_reqs = torch.arange(rank, self.num_reqs, tp, dtype=torch.int32, device=dev)
        self.local_kw = sample_kwargs(
            mine_t, local_reqs,
            torch.arange(0, n_local + 1, k + 1, dtype=torch.int32, device=dev),
            local_reqs.repeat_interleave(k + 1),
            torch.arange(k + 1, dtype=torch.int32, device=dev).repeat(len(local_reqs)))
        comm = _ReplayComm(self.received)
        group = types.SimpleNamespace(rank_in_group=rank, world_size=tp,
                                      device_communicator=types.SimpleNamespace(pynccl_comm=comm))
        bs.get_tp_group = lambda: group
        self.num_rejected = torch.zeros(len(local_reqs), dtype=torch.int32, device=dev)
        self.gathered = None  # the output all-gather's result buffer, made on first use
        bs.tensor_model_parallel_all_gather = self._all_gather
        self.sharder = bs.BatchSharder(MAX_NUM_SEQS, k + 1, dev, False, None)

    def _all_gather(self, packed: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """The packed-output all-gather: this rank's block is copied in; the other ranks'
        blocks hold zeros (never read for this rank's requests)."""
        m = packed.shape[0]
        if self.gathered is None or self.gathered.shape[1:] != packed.shape[1:]:
            self.gathered = torch.zeros((self.tp * m,) + tuple(packed.shape[1:]),
                                        dtype=packed.dtype, device=packed.device)
        self.gathered[self.rank * m:(self.rank + 1) * m].copy_(packed)
        return self.gathered

    def __call__(self):
        """One step of this rank's work; returns vLLM's ``SamplerOutput`` (all requests;
        only this rank's requests are meaningful here)."""
        bs = self.bs
        local_batch, _sorted, _grammar, meta = self.sharder.shard_sampler_inputs(
            self.batch, None)
        logits = bs.all_to_all_vocab_shards(self.send, meta.num_logits_per_rank,
                                            meta.num_local_logits)
        logits = logits[:, :self.vocab]
        sampled, num_sampled = self.sample(logits, self.local_kw)
        # num_rejected comes from get_num_sampled_and_rejected, which both of vLLM's paths
        # run and neither side times: a constant stands in for it here
        local_out = types.SimpleNamespace(sampled_token_ids=sampled, num_sampled=num_sampled,
                                          num_rejected=self.num_rejected, num_nans=None)
        return bs.gather_sampler_output(local_out, meta, self.send.device, self.batch,
                                        local_batch, gather_num_nans=False, logprobs_dims=None)

    def check_layout(self) -> None:
        """vLLM's plan kernel must pick the rows :func:`owned_rows` says (fail closed)."""
        local_batch, _s, _g, meta = self.sharder.shard_sampler_inputs(self.batch, None)
        got = local_batch.logits_indices.tolist()
        if got != self.mine or meta.num_logits_per_rank != self.send_splits:
            raise RuntimeError(f"vLLM's batch shard plan gives rank {self.rank} rows {got} "
                               f"(splits {meta.num_logits_per_rank}); the benchmark assumed "
                               f"{self.mine} ({self.send_splits})")

    def my_requests(self) -> list[int]:
        return list(range(self.rank, self.num_reqs, self.tp))

"""``vllm-kimi-ext draft train``: speculators' EAGLE-3 training on the captured data.

The model, the test-time-training unroll and its loss (KL to the target's
distribution at each of ``ttt_steps`` draft depths), the vocabulary maps, the
sample preprocessing (``shift_batch``), the packing sampler and the collate
function are speculators'. This module feeds them the data directory's shards and
runs the optimisation on one device (CUDA when present, else CPU): AdamW, cosine
schedule with warm-up, gradient clipping at 1.0, as speculators' own trainer does.
Multi-GPU runs use ``speculators train`` (torchrun, FSDP) on the same directory
(:func:`.export.write_speculators_dataset`) and ``--init`` its checkpoint here to export.

The result is exported with :func:`.bridge.export_flat` and checked with the
doctor against the target before the command reports success.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Sequence
from pathlib import Path

from . import bridge, export, layout, runstate
from .layout import DataError, Sample
from .settings import TrainConfig

#: Keys of a collated batch the speculators model's forward takes.
_MODEL_INPUTS = ("hidden_states", "input_ids", "verifier_last_hidden_states", "loss_mask",
                 "position_ids", "document_ids")


@dataclasses.dataclass
class TrainResult:
    out_dir: Path
    steps: int
    losses: list[float]
    tokens: int
    seconds: float
    device: str
    doctor: dict

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def capture_settings(data_dir: str | Path) -> dict:
    cap = layout.read_manifest(data_dir).get("capture")
    if not cap:
        raise DataError(f"{Path(data_dir) / layout.MANIFEST}: no capture section "
                        "(run `vllm-kimi-ext draft capture` first)")
    if isinstance(cap.get("layer_ids"), list):  # an older manifest without the aux ids
        cap.setdefault("aux_layer_ids", cap["layer_ids"][:-1])
    return cap


def make_dataset(data_dir: str | Path, samples: Sequence[Sample], max_len: int, dtype,
                 prompt_context: int | None = None):
    """A speculators dataset over the data directory's shards (one item per sample).

    ``prompt_context``: drop all but the last N prompt tokens of each sample (their
    hidden states were captured with the whole prompt; the draft's own attention then
    sees N prompt tokens). Training compute falls with the prompt share; the loss,
    which covers response tokens only, keeps every term."""
    import torch
    from safetensors import safe_open
    from speculators.train.data import BaseDataset

    data_dir = Path(data_dir)

    class ShardDataset(BaseDataset):
        def _start(self, s: Sample) -> int:
            if prompt_context is None:
                return 0
            return max(0, s.prompt_len - prompt_context)

        def _compute_approx_lengths(self):
            return [min(s.num_tokens - self._start(s), max_len) for s in samples]

        def __len__(self):
            return len(samples)

        def _get_raw_data(self, index: int):
            s = samples[index]
            path = layout.hidden_path(data_dir, s.index)
            a = self._start(s)
            b = min(s.num_tokens, a + max_len)  # rows past max_len are never read
            with safe_open(str(path), framework="pt") as fh:
                ids = fh.get_slice("token_ids")[:]
                hs = fh.get_slice("hidden_states")[a:b]
            expected = layout.with_tokens(data_dir, s).input_ids
            if not torch.equal(ids.long(), torch.tensor(expected, dtype=torch.long)):
                raise DataError(f"{path}: token_ids differ from sample {s.index}")
            check_finite_shard(path, hs, first_token=a)
            return {"hidden_states": hs[:, :-1].flatten(1),
                    "input_ids": ids[a:b].long(),
                    "verifier_last_hidden_states": hs[:, -1],
                    "loss_mask": torch.tensor(s.loss_mask[a:b], dtype=torch.bool)}

    return ShardDataset(max_len, hidden_states_dtype=dtype)


def check_finite_shard(path: Path, hidden, first_token: int = 0) -> None:
    """Refuse a shard whose hidden states (the draft's inputs, or the last layer the
    loss's targets come from) hold NaN or infinities. ``hidden`` holds the shard's rows
    from ``first_token`` on (the rows a reader takes)."""
    import torch

    finite = torch.isfinite(hidden)
    if not bool(finite.all()):
        bad = (~finite).reshape(-1, hidden.shape[-1]).any(-1).reshape(hidden.shape[:-1])
        token, layer = (int(i) for i in torch.nonzero(bad)[0])
        token += first_token
        what = ("the last layer (the loss's targets)" if layer == hidden.shape[1] - 1
            else f"aux layer {layer}")
        raise DataError(f"{path}: hidden_states hold NaN or infinite values (token {token}, "
                        f"{what}); delete the shard and run `draft capture` again")


def first_non_finite(model) -> str | None:
    """The name of the first parameter or buffer of ``model`` holding NaN/inf, or None."""
    import torch

    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t is not None and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None


def check_train_data(data_dir: str | Path, target_cfg: dict, *, flag: str = "--data",
                     rehash: bool = False) -> dict:
    """The data directory holds a capture of this target (same hidden size and depth)
    whose shards all match their capture records (:func:`.layout.check_shards`; ``rehash``:
    checksums and finiteness read again), at least one of them; returns the capture
    section."""
    cap = capture_settings(data_dir)
    manifest = Path(data_dir) / layout.MANIFEST
    for key, want in (("hidden_size", target_cfg["hidden_size"]),
                      ("num_hidden_layers", target_cfg["num_hidden_layers"])):
        got = cap.get(key)
        if got is not None and got != want:
            raise DataError(f"{flag} {data_dir}: captured with {key} {got} ({manifest}), the "
                            f"target has {want}: another target's hidden states")
    ids = cap.get("layer_ids")
    if not isinstance(ids, list) or len(ids) < 2 or not isinstance(cap.get("hidden_size"), int):
        raise DataError(f"{manifest}: capture section without layer_ids / hidden_size; run "
                        "`draft capture` again")
    samples = layout.read_samples(data_dir, tokens=False)
    have, _ = layout.check_shards(data_dir, samples, len(ids), cap["hidden_size"],
                                  rehash=rehash, flag=flag)
    if not have:
        raise DataError(f"{flag} {data_dir}: no complete hidden-state shard (run `vllm-kimi-ext "
                        "draft capture` first)")
    return cap


def captured_samples(data_dir: str | Path, samples: Sequence[Sample], cap: dict, *,
                     log=print, what: str = "training") -> list[Sample]:
    """The samples of ``samples`` with a shard that matches its capture record; a bad
    shard refuses (:func:`.layout.check_shards`), samples never captured are counted in
    a warning."""
    have, missing = layout.check_shards(data_dir, list(samples), len(cap["layer_ids"]),
                                        cap["hidden_size"])
    if missing:
        log(f"warning: {len(missing)} of {len(samples)} samples have no hidden-state shard "
            f"(capture not finished?); {what} uses the {len(have)} captured")
    return have


def make_sampler(dataset, max_len: int, seed: int, ranks=None):
    """speculators' packing sampler: batches of <= ``max_len`` tokens, the same number
    on every rank, each rank its own."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    return MultipackDistributedBatchSamplerV2(
        batch_max_length=max_len, lengths=dataset.approx_lengths,
        num_replicas=ranks.world if ranks else 1, rank=ranks.rank if ranks else 0, seed=seed)


def make_loader(dataset, *, max_len: int, hidden_size: int, num_aux: int, dtype,
                seed: int = TrainConfig.seed, batch_sampler=None, workers: int = 0):
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import CollateFn
    from torch.utils.data import DataLoader

    if batch_sampler is None:
        batch_sampler = make_sampler(dataset, max_len, seed)
    collate = CollateFn(max_len, hidden_size, num_target_layers=num_aux, dtype=dtype,
                        preprocess=shift_batch)
    return DataLoader(dataset, batch_sampler=batch_sampler, collate_fn=collate,
                      num_workers=workers, persistent_workers=False)


def model_inputs(batch: dict, device) -> dict:
    return {k: batch[k].to(device) for k in _MODEL_INPUTS if k in batch}


def loss_config(device):
    from speculators.losses import resolve_loss_config

    # the fused loss is a Triton kernel: CUDA only
    return resolve_loss_config("kl_div", "fused" if device.type == "cuda" else "eager")


def draft_vocab(data_dir: str | Path, target_dir: str | Path, samples: Sequence[Sample], *,
                size: int | None, from_dir: str | Path | None):
    """``(t2d, d2t)`` or ``(None, None)`` (full vocabulary).

    ``from_dir``: the maps of a shrink-vocab output (or any reduced head). ``size``:
    the most frequent ids of the data's responses, with bos/eos/pad always kept
    (shrink-vocab's selection rule)."""
    from collections import Counter

    from vllm_kimi_ext.drafts.shrink_vocab.shrink import ShrinkVocabError, select_kept_ids

    if from_dir is not None and size is not None:
        raise DataError("--draft-vocab-from and --draft-vocab-size exclude each other")
    tcfg = bridge.target_text_config(target_dir)
    vocab = int(tcfg["vocab_size"])
    if from_dir is not None:
        t2d, d2t = bridge.read_vocab_maps(from_dir)
        if t2d is None:
            raise DataError(f"--draft-vocab-from {from_dir}: no d2t/t2d tensors")
        if t2d.numel() != vocab:
            raise DataError(f"--draft-vocab-from {from_dir}: t2d covers {t2d.numel()} ids, the "
                            f"target has {vocab}")
        return t2d, d2t
    if size is None or size >= vocab:
        return None, None
    counts: Counter = Counter()
    wanted = {s.index for s in samples}
    for s in layout.iter_samples(data_dir):  # one at a time: the tokens the loss covers
        if s.index in wanted:
            counts.update(t for t, m in zip(s.input_ids, s.loss_mask) if m)
    forced = set()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = tcfg.get(key)
        forced.update(v if isinstance(v, list) else [v] if v is not None else [])
    try:
        kept = select_kept_ids(counts, forced, size, vocab)
    except ShrinkVocabError as exc:
        raise DataError(str(exc)) from None
    return bridge.vocab_maps_from_ids(kept, vocab)


def split_samples(samples: Sequence[Sample], holdout: Sequence[str] | None = None
                  ) -> list[Sample]:
    """Samples whose prompt hash is not in ``holdout``."""
    held = set(holdout or ())
    return [s for s in samples if s.prompt_hash not in held]


def truncation(samples: Sequence[Sample], max_len: int, prompt_context: int | None = None
               ) -> dict:
    """What ``max_len`` drops: samples cut, tokens dropped, and how many of those are
    response tokens (loss terms lost). Counted before any work, so the run warns
    first and records the counts."""
    cut = dropped = loss_dropped = 0
    for s in samples:
        start = 0 if prompt_context is None else max(0, s.prompt_len - prompt_context)
        # the kept window is [start, start + max_len); --prompt-context may drop
        # earlier assistant turns of a conversation (loss tokens) before it
        loss_dropped += s.num_loss_tokens - s.loss_tokens_after(start)
        n = s.num_tokens - start
        if n > max_len:
            cut += 1
            dropped += n - max_len
            loss_dropped += s.loss_tokens_after(start + max_len)
    return {"max_len": max_len, "samples_cut": cut, "samples": len(samples),
            "tokens_dropped": dropped, "loss_tokens_dropped": loss_dropped,
            "loss_tokens": sum(s.num_loss_tokens for s in samples)}


def check_kept_tokens(counts: dict, floor: int) -> None:
    """Refuse a run that would train on fewer than ``floor`` response tokens (after
    ``--max-len`` and ``--prompt-context``): a head trained on nothing still exports."""
    kept = counts["loss_tokens"] - counts["loss_tokens_dropped"]
    if kept < floor:
        raise DataError(
            f"--max-len {counts['max_len']}: keeps {kept} of {counts['loss_tokens']} response "
            f"tokens of {counts['samples']} training samples ({counts['samples_cut']} cut), "
            f"below --min-train-tokens {floor}; nothing trained (raise --max-len or "
            "--prompt-context, or add data)", field="--max-len")


def warn_truncation(counts: dict, flag: str, log=print) -> None:
    if counts["samples_cut"]:
        log(f"warning: {flag} {counts['max_len']} cuts {counts['samples_cut']} of "
            f"{counts['samples']} samples: {counts['tokens_dropped']} tokens dropped, "
            f"{counts['loss_tokens_dropped']} of {counts['loss_tokens']} response tokens "
            f"not trained on (raise {flag} to keep them)")


def folder_digest(folder: str | Path | None) -> str | None:
    """The identity of a model folder, independent of where it lies: its config.json
    bytes and the name and size of every file (the weights are not read: a Kimi-K2.5
    target is ~600 GB)."""
    if folder is None:
        return None
    root = Path(folder)
    h = hashlib.sha256()
    config = root / "config.json"
    h.update(config.read_bytes() if config.is_file() else b"")
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(root)}\0{p.stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def run_identity(config: TrainConfig, *, data_dir, target_dir, init, samples, val,
                 world: int) -> dict:
    """The settings a checkpoint must share with the run resuming it that are known
    before any model is built: the optimisation settings and the content (not the
    paths) of the data, the target and ``--init``, and the number of ranks."""
    keep = ("lr", "warmup_ratio", "max_len", "prompt_context", "ttt_steps", "seed",
            "val_fraction", "val_every", "patience")
    return {**{k: getattr(config, k) for k in keep},
            "train_data": layout.content_digest(data_dir, list(samples)),
            "val_data": layout.content_digest(data_dir, list(val)),
            "target_content": folder_digest(target_dir), "init_content": folder_digest(init),
            "world_size": world}


def run_settings(config: TrainConfig, *, data_dir, target_dir, init, samples, val,
                 world: int, total: int, vocab) -> dict:
    """The settings a checkpoint must share with the run resuming it: :func:`run_identity`
    plus what the model and sampler decide."""
    return {**run_identity(config, data_dir=data_dir, target_dir=target_dir, init=init,
                           samples=samples, val=val, world=world),
            "total_steps": total, "draft_vocab": vocab}


def default_checkpoint_dir(out_dir: str | Path) -> Path:
    """Where checkpoints go without ``--checkpoint-dir``: ``OUT.checkpoints`` beside it."""
    return Path(f"{Path(out_dir)}.checkpoints")


def train(
    data_dir: str | Path,
    target_dir: str | Path,
    out_dir: str | Path,
    *,
    init: str | Path | None = None,
    draft_vocab_size: int | None = None,
    draft_vocab_from: str | Path | None = None,
    holdout: Sequence[str] | None = None,
    config: TrainConfig | None = None,
    options: bridge.DraftOptions | None = None,
    progress: bool | None = None,
    log=print,
    force: bool = False,
) -> TrainResult:
    """Train (or fine-tune ``init``) a draft on ``data_dir``; export it to ``out_dir``.

    Under ``torchrun`` every rank runs this function (data parallel, see
    :mod:`.runstate`); rank 0 writes checkpoints, the export and the doctor's
    report, the other ranks return a result without them.

    Long because: the loop, its checkpoints, validation and the final export/doctor
    step read best together; the data, model and loss pieces are the helpers above.
    """
    import torch
    from tqdm import tqdm
    from transformers import get_cosine_schedule_with_warmup

    bridge.require_speculators()
    config = config or TrainConfig()
    options = options or bridge.DraftOptions()
    cap = capture_settings(data_dir)
    samples = captured_samples(data_dir, split_samples(
        layout.read_samples(data_dir, tokens=False), holdout), cap, log=log)
    if not samples:
        raise DataError(f"{data_dir}: no captured samples to train on")
    samples, val_samples = runstate.split_validation(samples, config.val_fraction, config.seed)
    if not samples:
        raise DataError(f"--val-fraction {config.val_fraction} leaves no training samples")
    if config.val_fraction and not val_samples:
        raise DataError(f"--val-fraction {config.val_fraction} selects no conversation of "
                        f"{len(samples)} for validation; raise it")
    ckpt_dir = Path(config.checkpoint_dir) if config.checkpoint_dir else None
    if (config.checkpoint_every or config.resume) and ckpt_dir is None:
        ckpt_dir = default_checkpoint_dir(out_dir)
    if ckpt_dir is not None and not config.resume and runstate.checkpoint_dirs(ckpt_dir):
        raise DataError(f"{ckpt_dir}: holds checkpoints of an earlier run; pass --resume to "
                        "continue it or choose another --checkpoint-dir")
    if config.resume:  # before the ranks, the model and the data are set up
        runstate.check_resume_identity(ckpt_dir, run_identity(
            config, data_dir=data_dir, target_dir=target_dir, init=init, samples=samples,
            val=val_samples, world=runstate.world_size_from_env()))
    if config.max_steps != 0:  # 0: --init exported as it is, nothing trained
        check_kept_tokens(truncation(samples, config.max_len, config.prompt_context),
                          config.min_train_tokens)
    ranks = runstate.setup_ranks(config.device)
    try:
        return _train(data_dir, target_dir, out_dir, init=init, samples=samples,
                      val_samples=val_samples, ckpt_dir=ckpt_dir, ranks=ranks, cap=cap,
                      draft_vocab_size=draft_vocab_size, draft_vocab_from=draft_vocab_from,
                      config=config, options=options, progress=progress, log=log, force=force,
                      tqdm=tqdm, torch=torch, schedule=get_cosine_schedule_with_warmup)
    finally:
        ranks.close()


def _train(data_dir, target_dir, out_dir, *, init, samples, val_samples, ckpt_dir, ranks,
           cap, draft_vocab_size, draft_vocab_from, config, options, progress, log, force,
           tqdm, torch, schedule) -> TrainResult:
    """The body of :func:`train` once the ranks are set up.

    Long because: the loop reads best in one piece with its resume, validation and
    checkpoint points; each of those is a helper (:func:`_validate`,
    :func:`_checkpoint`, :mod:`.runstate`)."""
    if not ranks.is_main:
        log = _quiet
    torch.manual_seed(config.seed)
    device = ranks.device
    trunc = truncation(samples, config.max_len, config.prompt_context)
    warn_truncation(trunc, "--max-len", log)
    t2d, d2t = draft_vocab(data_dir, target_dir, samples, size=draft_vocab_size,
                           from_dir=draft_vocab_from)
    model = bridge.build_draft(target_dir, cap["aux_layer_ids"], init=init, t2d=t2d, d2t=d2t,
                               options=options, ttt_steps=config.ttt_steps).to(device)
    bad = first_non_finite(model)
    if bad is not None:
        raise DataError(f"{'--init ' + str(init) if init else '--target ' + str(target_dir)}: "
                        f"tensor {bad} holds NaN or infinite values; nothing trained")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dataset = make_dataset(data_dir, samples, config.max_len, dtype, config.prompt_context)
    sampler = make_sampler(dataset, config.max_len, config.seed, ranks)
    workers = (config.loader_workers if config.loader_workers is not None else
        (2 if device.type == "cuda" else 0))

    def loader_for(batch_sampler, ds):
        return make_loader(ds, max_len=config.max_len, hidden_size=cap["hidden_size"],
                           num_aux=len(cap["aux_layer_ids"]), dtype=dtype,
                           batch_sampler=batch_sampler, workers=workers)

    val_loader = None
    if val_samples:
        val_ds = make_dataset(data_dir, val_samples, config.max_len, dtype,
                              config.prompt_context)
        val_loader = loader_for(make_sampler(val_ds, config.max_len, config.seed, ranks),
                                val_ds)
        if not ranks.all_sum([len(val_loader)])[0]:
            raise DataError(f"the validation split ({len(val_samples)} samples) makes no "
                            f"batch for {ranks.world} ranks; raise --val-fraction")
    per_epoch = len(sampler)
    if per_epoch == 0:
        raise DataError(f"{data_dir}: {len(samples)} training samples make no batch for "
                        f"{ranks.world} ranks")
    total = (config.max_steps if config.max_steps is not None else
        max(1, math.ceil(per_epoch * config.epochs)))  # max_steps 0: export the initialisation
    val_every = config.val_every or per_epoch
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr)
    sched = schedule(opt, int(total * config.warmup_ratio), total)
    lc = loss_config(device)
    settings = run_settings(config, data_dir=data_dir, target_dir=target_dir, init=init,
                            samples=samples, val=val_samples, world=ranks.world, total=total,
                            vocab=int(model.config.draft_vocab_size))
    st = {"epoch": 0, "batch_in_epoch": 0, "step": 0, "losses": [], "tokens": 0,
          "val": [], "best_loss": None, "best_step": None, "stale": 0, "stopped": None}
    best_state = None
    resumed_from = None
    if config.resume:
        found = runstate.load_latest(ckpt_dir)
        if found is None:
            log(f"resume: no checkpoint in {ckpt_dir}; starting from the beginning")
        else:
            path, payload = found
            runstate.check_same_run(payload["run"], settings, str(path))
            runstate.load_trainable_state(model, payload["model"], str(path))
            opt.load_state_dict(payload["optimizer"])
            sched.load_state_dict(payload["scheduler"])
            st = payload["loop"]
            best_state = payload.get("best")
            runstate.set_rng_state(payload["rng"][ranks.rank])
            resumed_from = str(path)
            log(f"resume: {path} (step {st['step']} of {total}, epoch {st['epoch']})")
    ddp = runstate.wrap_data_parallel(model, ranks)
    log(f"train: {len(samples)} samples, {sum(s.num_tokens for s in samples)} tokens, "
        f"{per_epoch} steps/epoch of <= {config.max_len} tokens per rank, {total} steps on "
        f"{ranks.world} x {device}; {sum(p.numel() for p in params)} trainable parameters, "
        f"draft vocabulary {model.config.draft_vocab_size}, init {init or 'fresh'}"
        + (f"; validation: {len(val_samples)} samples" if val_samples else ""))
    bar = tqdm(total=total, initial=st["step"], desc="train", unit="step",
               disable=(not ranks.is_main) or (None if progress is None else not progress))
    t0 = time.perf_counter()
    while st["step"] < total and st["stopped"] is None:
        sampler.set_epoch(st["epoch"])
        loader = loader_for(runstate.SkipBatches(sampler, st["batch_in_epoch"]), dataset)
        for batch in loader:
            model.train()
            inputs = model_inputs(batch, device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                _, loss, _ = ddp(**inputs, ttt_steps=config.ttt_steps, loss_config=lc)
            # every rank sees the summed loss, so a non-finite one on any rank stops all
            mean_loss, ntok = ranks.all_sum([float(loss.detach()),
                                             int((batch["document_ids"] != -1).sum())])
            if not math.isfinite(mean_loss):
                raise DataError(f"step {st['step'] + 1} of {total}: the loss is "
                                f"{mean_loss / ranks.world}; training stopped and nothing was "
                                "exported (lower --lr, or check the data)")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            st["losses"].append(mean_loss / ranks.world)
            st["tokens"] += int(ntok)
            st["step"] += 1
            st["batch_in_epoch"] += 1
            bar.update(1)
            if config.log_every and st["step"] % config.log_every == 0:
                bar.set_postfix(loss=f"{st['losses'][-1]:.3f}")
            if val_loader is not None and (st["step"] % val_every == 0 or st["step"] >= total):
                best_state = _validate(model, val_loader, ranks, lc, config, st, best_state,
                                       log)
            if (config.checkpoint_every and st["step"] % config.checkpoint_every == 0
                    and st["step"] < total):
                _checkpoint(ckpt_dir, model, opt, sched, st, best_state, settings, ranks, log)
            if st["step"] >= total or st["stopped"] is not None:
                break
        else:
            st["epoch"] += 1
            st["batch_in_epoch"] = 0
    bar.close()
    seconds = time.perf_counter() - t0
    if best_state is not None:
        runstate.load_trainable_state(model, best_state, "best validation state")
    bad = first_non_finite(model)  # the same weights on every rank: all stop together
    if bad is not None:
        raise DataError(f"after step {st['step']}: tensor {bad} holds NaN or infinite values; "
                        "nothing was exported (lower --lr, or check the data)")
    record = {"data": str(data_dir), "target": str(target_dir), "init": str(init or "fresh"),
              "config": dataclasses.asdict(config), "options": dataclasses.asdict(options),
              "samples": len(samples), "val_samples": len(val_samples),
              "world_size": ranks.world, "steps": st["step"], "tokens": st["tokens"],
              "seconds": round(seconds, 3), "device": str(device),
              "tokens_per_s": round(st["tokens"] / seconds, 3) if seconds else None,
              "losses": [round(x, 5) for x in st["losses"]],
              "validation": st["val"], "best_step": st["best_step"],
              "stopped_early": st["stopped"], "resumed_from": resumed_from,
              "truncation": trunc}
    out, doctor = export.export_on_main(ranks, model, target_dir, out_dir, record,
                                        force=force, log=log)
    return TrainResult(out, st["step"], st["losses"], st["tokens"], seconds, str(device),
                       doctor)


def _quiet(_msg: str) -> None:
    return None


def _validate(model, loader, ranks, lc, config, st, best_state, log):
    """Mean validation loss over every rank's batches; track the best state and
    early stopping. Returns the (possibly new) best state."""
    import torch

    model.eval()
    total = n = 0.0
    with torch.no_grad():
        for batch in loader:
            inputs = model_inputs(batch, ranks.device)
            with torch.autocast(ranks.device.type, dtype=torch.bfloat16,
                                enabled=ranks.device.type == "cuda"):
                _, loss, _ = model(**inputs, ttt_steps=config.ttt_steps, loss_config=lc)
            total += float(loss)
            n += 1
    total, n = ranks.all_sum([total, n])
    val = total / n
    st["val"].append([st["step"], round(val, 6)])
    if st["best_loss"] is None or val < st["best_loss"]:
        st["best_loss"], st["best_step"], st["stale"] = val, st["step"], 0
        best_state = runstate.trainable_state(model)
    else:
        st["stale"] += 1
    log(f"validation at step {st['step']}: loss {val:.4f} (best {st['best_loss']:.4f} at "
        f"step {st['best_step']})")
    if config.patience and st["stale"] >= config.patience:
        st["stopped"] = st["step"]
        log(f"early stop at step {st['step']}: no validation improvement in "
            f"{config.patience} checks; keeping step {st['best_step']}")
    return best_state


def _checkpoint(ckpt_dir, model, opt, sched, st, best_state, settings, ranks, log):
    """Every rank hands over its RNG state; rank 0 writes the checkpoint. A write that
    fails (a full disk) stops every rank together: rank 0 with its one-line refusal,
    the others naming rank 0's."""
    import copy

    from vllm_kimi_ext.user_input import UserInputError

    rngs = ranks.gather(runstate.rng_state())
    failed: UserInputError | None = None
    if ranks.is_main:
        payload = {"run": settings, "model": runstate.trainable_state(model),
                   "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                   "loop": copy.deepcopy(st), "best": best_state, "rng": rngs}
        try:
            path = runstate.save_checkpoint(ckpt_dir, st["step"], payload)
            log(f"checkpoint: {path}")
        except UserInputError as exc:
            failed = exc
    if ranks.all_sum([failed is not None])[0]:
        raise failed or DataError(f"rank {ranks.rank}: stopped because rank 0 could not "
                                  f"write the checkpoint of step {st['step']} in {ckpt_dir}")
    ranks.barrier()

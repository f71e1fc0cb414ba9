"""``vllm-kimi-ext draft train``: speculators' EAGLE-3 training on the captured data.

The model, the test-time-training unroll and its loss (KL to the target's
distribution at each of ``ttt_steps`` draft depths), the vocabulary maps, the
sample preprocessing (``shift_batch``), the packing sampler and the collate
function are speculators'. This module feeds them the data directory's shards and
runs the optimisation on one device (CUDA when present, else CPU): AdamW, cosine
schedule with warm-up, gradient clipping at 1.0, as speculators' own trainer does.
Multi-GPU runs use ``speculators train`` (torchrun, FSDP) on the same directory
(:func:`write_speculators_dataset`) and ``--init`` its checkpoint here to export.

The result is exported with :func:`.bridge.export_flat` and checked with the
doctor against the target before the command reports success.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from . import bridge, layout
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
    return cap


def make_dataset(data_dir: str | Path, samples: Sequence[Sample], max_len: int, dtype,
                 prompt_context: int | None = None):
    """A speculators dataset over the data directory's shards (one item per sample).

    ``prompt_context``: drop all but the last N prompt tokens of each sample (their
    hidden states were captured with the whole prompt; the draft's own attention then
    sees N prompt tokens). Training compute falls with the prompt share; the loss,
    which covers response tokens only, keeps every term."""
    import torch
    from safetensors.torch import load_file
    from speculators.train.data import BaseDataset

    data_dir = Path(data_dir)

    class ShardDataset(BaseDataset):
        def _start(self, s: Sample) -> int:
            if prompt_context is None:
                return 0
            return max(0, len(s.prompt_token_ids) - prompt_context)

        def _compute_approx_lengths(self):
            return [min(s.num_tokens - self._start(s), max_len) for s in samples]

        def __len__(self):
            return len(samples)

        def _get_raw_data(self, index: int):
            s = samples[index]
            path = layout.hidden_path(data_dir, s.index)
            t = load_file(str(path))
            if t["token_ids"].tolist() != s.input_ids:
                raise DataError(f"{path}: token_ids differ from sample {s.index}")
            a = self._start(s)
            hs = t["hidden_states"][a:]
            return {"hidden_states": hs[:, :-1].flatten(1),
                    "input_ids": t["token_ids"][a:].long(),
                    "verifier_last_hidden_states": hs[:, -1],
                    "loss_mask": torch.tensor(s.loss_mask[a:], dtype=torch.bool)}

    return ShardDataset(max_len, hidden_states_dtype=dtype)


def make_loader(dataset, *, max_len: int, hidden_size: int, num_aux: int, dtype, seed: int):
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import CollateFn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from torch.utils.data import DataLoader

    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=max_len, lengths=dataset.approx_lengths, num_replicas=1, rank=0,
        seed=seed)
    collate = CollateFn(max_len, hidden_size, num_target_layers=num_aux, dtype=dtype,
                        preprocess=shift_batch)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=0)


def model_inputs(batch: dict, device) -> dict:
    return {k: batch[k].to(device) for k in _MODEL_INPUTS if k in batch}


def resolve_device(device: str | None):
    import torch

    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


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
    for s in samples:
        counts.update(s.output_token_ids)
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
) -> TrainResult:
    """Train (or fine-tune ``init``) a draft on ``data_dir``; export it to ``out_dir``.

    Long because: the loop, its logging and the final export/doctor step read best
    together; the data, model and loss pieces are the helpers above.
    """
    import torch
    from tqdm import tqdm
    from transformers import get_cosine_schedule_with_warmup

    bridge.require_speculators()
    config = config or TrainConfig()
    options = options or bridge.DraftOptions()
    cap = capture_settings(data_dir)
    samples = [s for s in split_samples(layout.read_samples(data_dir), holdout)
               if layout.captured(data_dir, s, len(cap["layer_ids"]), cap["hidden_size"])]
    if not samples:
        raise DataError(f"{data_dir}: no captured samples to train on")
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    t2d, d2t = draft_vocab(data_dir, target_dir, samples, size=draft_vocab_size,
                           from_dir=draft_vocab_from)
    model = bridge.build_draft(target_dir, cap["aux_layer_ids"], init=init, t2d=t2d, d2t=d2t,
                               options=options, ttt_steps=config.ttt_steps).to(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dataset = make_dataset(data_dir, samples, config.max_len, dtype, config.prompt_context)
    loader = make_loader(dataset, max_len=config.max_len, hidden_size=cap["hidden_size"],
                         num_aux=len(cap["aux_layer_ids"]), dtype=dtype, seed=config.seed)
    per_epoch = len(loader)
    total = config.max_steps if config.max_steps is not None else \
        max(1, math.ceil(per_epoch * config.epochs))  # max_steps 0: export the initialisation
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr)
    sched = get_cosine_schedule_with_warmup(opt, int(total * config.warmup_ratio), total)
    lc = loss_config(device)
    log(f"train: {len(samples)} samples, {sum(s.num_tokens for s in samples)} tokens, "
        f"{per_epoch} steps/epoch of <= {config.max_len} tokens, {total} steps on {device}; "
        f"{sum(p.numel() for p in params)} trainable parameters, draft vocabulary "
        f"{model.config.draft_vocab_size}, init {init or 'fresh'}")
    model.train()
    losses: list[float] = []
    tokens, step, epoch = 0, 0, 0
    bar = tqdm(total=total, desc="train", unit="step",
               disable=None if progress is None else not progress)
    t0 = time.perf_counter()
    while step < total:
        loader.batch_sampler.set_epoch(epoch)
        for batch in loader:
            inputs = model_inputs(batch, device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                _, loss, _ = model(**inputs, ttt_steps=config.ttt_steps, loss_config=lc)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            tokens += int((batch["document_ids"] != -1).sum())
            step += 1
            bar.update(1)
            if config.log_every and step % config.log_every == 0:
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if step >= total:
                break
        epoch += 1
    bar.close()
    seconds = time.perf_counter() - t0
    out = bridge.export_flat(model.cpu(), target_dir, out_dir)
    record = {"data": str(data_dir), "target": str(target_dir), "init": str(init or "fresh"),
              "config": dataclasses.asdict(config), "options": dataclasses.asdict(options),
              "samples": len(samples), "steps": step, "tokens": tokens,
              "seconds": round(seconds, 3), "device": str(device),
              "tokens_per_s": round(tokens / seconds, 3) if seconds else None,
              "losses": [round(x, 5) for x in losses], "library": _library_version()}
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose

    report = diagnose(target_dir, out, method="eagle3")
    log(report.format_text())
    return TrainResult(out, step, losses, tokens, seconds, str(device), report.to_dict())


def _library_version() -> str:
    from importlib import metadata

    try:
        return f"speculators {metadata.version('speculators')}"
    except metadata.PackageNotFoundError:
        import speculators

        return f"speculators {getattr(speculators, '__version__', '?')}"


def write_speculators_dataset(data_dir: str | Path) -> Path:
    """Write the Arrow dataset ``speculators train --data-path DATA`` reads next to the
    shards (columns ``input_ids``, ``loss_mask``, ``seq_len``; row i = ``hs_i``)."""
    import hashlib

    import pyarrow as pa
    from datasets import Dataset
    from datasets.table import InMemoryTable

    samples = layout.read_samples(data_dir)
    if [s.index for s in samples] != list(range(len(samples))):
        raise DataError(f"{data_dir}: sample indices are not 0..n-1; speculators reads "
                        "row i from hs_i.safetensors")
    table = pa.table({
        "input_ids": pa.array([s.input_ids for s in samples], type=pa.list_(pa.int64())),
        "loss_mask": pa.array([[bool(m) for m in s.loss_mask] for s in samples],
                              type=pa.list_(pa.bool_())),
        "seq_len": pa.array([s.num_tokens for s in samples], type=pa.int64())})
    # an explicit fingerprint: datasets' own (a pickle of the table) fails on some
    # pyarrow/dill combinations
    digest = hashlib.sha256((Path(data_dir) / layout.SAMPLES).read_bytes()).hexdigest()[:16]
    ds = Dataset(InMemoryTable(table), fingerprint=digest)
    ds.set_format(type="torch")
    ds.save_to_disk(str(data_dir))
    return Path(data_dir)

"""``draft train``'s outputs: the exported head (rank 0, renamed into place whole, then
checked by the doctor) and the Arrow dataset ``speculators train`` reads.

Under ``torchrun`` only rank 0 writes; :func:`export_on_main` makes every rank stop
together when it cannot (a full disk, a refused ``--out``), as checkpoints do: rank 0
with its own one-line refusal, the others naming rank 0's.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import bridge, layout
from .layout import DataError


def export_on_main(ranks, model, target_dir: str | Path, out_dir: str | Path, record: dict, *,
                   force: bool = False, log=print) -> tuple[Path, dict]:
    """Rank 0 exports ``model`` (:func:`export_atomically`) and runs the doctor on it; every
    rank learns whether that worked. Returns ``(out_dir, the doctor's report)`` (on the
    other ranks ``{"ok": True, "rank": r}``); raises on every rank when rank 0 failed."""
    failed: BaseException | None = None
    out, doctor = Path(out_dir), {"ok": True, "rank": ranks.rank}
    if ranks.is_main:
        try:
            out = export_atomically(model.cpu(), target_dir, out_dir,
                                    {**record, "library": _library_version()},
                                    force=force, log=log)
            from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose

            report = diagnose(target_dir, out, method="eagle3")
            log(report.format_text())
            doctor = report.to_dict()
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the other ranks know
            failed = exc
    if ranks.world > 1 and ranks.all_sum([failed is not None])[0]:
        if failed is None:
            raise DataError(f"rank {ranks.rank}: stopped because rank 0 could not export the "
                            f"draft to {out_dir} (rank 0 says why)")
    if failed is not None:
        raise failed
    ranks.barrier()
    return out, doctor


def export_atomically(model, target_dir: str | Path, out_dir: str | Path, record: dict, *,
                      force: bool = False, log=print) -> Path:
    """Export ``model`` and its ``training.json`` into a temporary folder beside
    ``out_dir`` and rename it into place: an interrupted or failed export (a full disk, a
    kill) leaves ``out_dir`` as it was. An existing non-empty ``out_dir`` needs ``force``."""
    from vllm_kimi_ext.drafts.shrink_vocab.output_dir import clean_stale, write_directory_atomically

    out = Path(out_dir)

    def write(tmp: Path) -> None:
        bridge.export_flat(model, target_dir, tmp)
        (tmp / "training.json").write_text(json.dumps(record, indent=1, default=str) + "\n")

    def exists(path: Path) -> Exception:
        return DataError(f"--out {path}: exists and is not empty; pass --force to replace it")

    empty = out.is_dir() and not any(out.iterdir())
    if out.parent.is_dir():
        for line in clean_stale(out.parent):  # what a killed earlier export left
            log(f"export: {line}")
    needed = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    write_directory_atomically(out, write, force=force or empty, exists_error=exists,
                               tool="draft-train", needed=needed)
    return out


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

    samples = layout.read_samples(data_dir, tokens=False)
    if [s.index for s in samples] != list(range(len(samples))):
        raise DataError(f"{data_dir}: sample indices are not 0..n-1; speculators reads "
                        "row i from hs_i.safetensors")
    schema = pa.schema([("input_ids", pa.list_(pa.int64())), ("loss_mask", pa.list_(pa.bool_())),
                        ("seq_len", pa.int64())])
    batches = []
    for start in range(0, len(samples), 1024):  # Python lists for 1024 samples at a time
        chunk = [layout.with_tokens(data_dir, s) for s in samples[start:start + 1024]]
        batches.append(pa.record_batch([
            pa.array([s.input_ids for s in chunk], type=pa.list_(pa.int64())),
            pa.array([[bool(m) for m in s.loss_mask] for s in chunk], type=pa.list_(pa.bool_())),
            pa.array([s.num_tokens for s in chunk], type=pa.int64())], schema=schema))
    table = pa.Table.from_batches(batches, schema=schema)
    # an explicit fingerprint: datasets' own (a pickle of the table) fails on some
    # pyarrow/dill combinations
    digest = hashlib.sha256((Path(data_dir) / layout.SAMPLES).read_bytes()).hexdigest()[:16]
    ds = Dataset(InMemoryTable(table), fingerprint=digest)
    ds.set_format(type="torch")
    ds.save_to_disk(str(data_dir))
    return Path(data_dir)

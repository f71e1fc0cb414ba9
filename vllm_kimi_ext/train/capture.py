"""The target's hidden states for every regenerated sample (``draft capture``).

What EAGLE-3 trains on, per token: the residual stream after the aux layers (the
ids vLLM taps when it serves the draft; vLLM 0.34.0's default for DeepSeek-V3 /
Kimi-K2.5 and Llama targets is ``(2, L // 2, L - 3)``, ``deepseek_v2.py`` and
``llama.py``) and after the last layer, before the final norm (layer id ``L``; the
loss's target distribution is ``lm_head(norm(h_L))``). A layer id ``i`` is the
state after ``i`` decoder layers, as in vLLM (id 0 is the embedding output).

Two backends write the same shards (``hidden_states`` ``[tokens, len(ids), hidden]``,
``token_ids`` ``[tokens]``; ids ascending, as vLLM returns them):

* :class:`VllmCapture`: vLLM 0.34.0's own mechanism, ``method:
  "extract_hidden_states"`` with the ``ExampleHiddenStatesConnector`` KV connector,
  at any tensor-parallel size (the aux states are taken after the all-reduce, so
  every rank holds them whole; TP rank 0 writes). Needs CUDA.
* :class:`TransformersCapture`: one transformers forward per sample
  (``output_hidden_states`` plus a hook on the final norm's input); CPU runs.

Before anything runs the disk the shards will take is printed and compared with
the free space; shards already present with the right shape are skipped.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from vllm_kimi_ext.outputs import file_mode, save_safetensors
from vllm_kimi_ext.user_input import disk_full_refusal, human_bytes

from . import layout
from .layout import DataError, Sample
from .settings import Capture

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
#: Per-shard overhead: safetensors header and the int64 token ids are counted apart.
SHARD_HEADER_BYTES = 256


def default_layer_ids(num_hidden_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 aux taps plus the last layer: ``[2, L//2, L-3, L]``; on a
    target too shallow for them (L < 6) the taps are clipped into ``[0, L-1]`` and
    merged, so the default fits every target (L = 4: ``[1, 2, 4]``)."""
    n = num_hidden_layers
    if n < 1:
        raise DataError(f"the target's num_hidden_layers is {n}, expected >= 1")
    return sorted({min(max(i, 0), n - 1) for i in (2, n // 2, n - 3)}) + [n]


def check_layer_ids(layer_ids: Sequence[int], num_hidden_layers: int) -> list[int]:
    ids = [int(i) for i in layer_ids]
    shown = " ".join(map(str, ids))
    if len(ids) < 2 or ids != sorted(set(ids)):
        raise DataError(f"--layer-ids {shown}: need >= 2 distinct ids in ascending order "
                        "(aux layers, then the last)", field="--layer-ids")
    if ids[0] < 0 or ids[-1] != num_hidden_layers:
        raise DataError(f"--layer-ids {shown}: ids must lie in [0, {num_hidden_layers}] and end "
                        f"with {num_hidden_layers} (the target has {num_hidden_layers} layers; "
                        "the last is the loss's target)", field="--layer-ids")
    return ids


def bytes_per_token(num_layers: int, hidden_size: int, dtype: str = Capture.dtype) -> int:
    """Shard bytes per token: the hidden states plus one int64 token id."""
    return num_layers * hidden_size * DTYPE_BYTES[dtype] + 8


def estimate_disk(samples: Sequence[Sample], num_layers: int, hidden_size: int,
                  dtype: str = Capture.dtype) -> int:
    tokens = sum(s.num_tokens for s in samples)
    return (tokens * bytes_per_token(num_layers, hidden_size, dtype) +
        len(samples) * SHARD_HEADER_BYTES)


class Backend(Protocol):
    description: dict
    hidden_size: int
    num_hidden_layers: int

    def capture(self, samples: Sequence[Sample], layer_ids: list[int],
                paths: Sequence[Path], dtype: str) -> None: ...


def _save_shard(path: Path, hidden, token_ids) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        save_safetensors({"hidden_states": hidden.contiguous(),
                          "token_ids": token_ids.contiguous()}, tmp)
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: no torn temporary file stays
        tmp.unlink(missing_ok=True)
        raise


def _verified(data_dir: Path, samples: Sequence[Sample], num_layers: int, hidden: int,
              records: dict[int, dict]) -> set[int]:
    """Indices of the samples whose shard has the expected shape and matches its record
    (size and sha256; checksums computed in parallel, hashlib releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    shaped = [s for s in samples if s.index in records
              and records[s.index].get("finite") is not False  # NaN: capture again
              and layout.captured(data_dir, s, num_layers, hidden)]
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        ok = pool.map(lambda s: layout.shard_matches(data_dir, s.index, records[s.index]),
                      shaped)
        return {s.index for s, good in zip(shaped, ok) if good}


def check_capture_data(data_dir: str | Path, vocab_size: int | None,
                       layer_ids: Sequence[int] | None, dtype: str,
                       hidden_size: int | None = None) -> list[Sample]:
    """What ``draft capture`` reads, checked before any engine is built: the samples
    (readable, token ids inside the target's vocabulary) and an earlier capture's
    settings (same layer ids, dtype and hidden size, or a new directory)."""
    data_dir = Path(data_dir)
    samples = layout.read_samples(data_dir, tokens=False)
    if not samples:
        raise DataError(f"{data_dir / layout.SAMPLES}: no samples (run `vllm-kimi-ext draft "
                        "regenerate` first)")
    for s in layout.iter_samples(data_dir) if vocab_size else ():  # one line at a time
        bad = next((t for t in s.input_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise DataError(f"{data_dir / layout.SAMPLES}: sample {s.index} holds token id "
                            f"{bad}, outside the target's vocabulary [0, {vocab_size})")
    previous = layout.read_manifest(data_dir).get("capture")
    if previous and layer_ids is not None and (previous.get("layer_ids") != list(layer_ids)
                     or previous.get("dtype") != dtype
                     or (hidden_size and previous.get("hidden_size") not in (None, hidden_size))):
        raise DataError(
            f"{data_dir / layout.MANIFEST}: captured with layer_ids {previous.get('layer_ids')} "
            f"dtype {previous.get('dtype')} hidden_size {previous.get('hidden_size')}; this run "
            f"asks {list(layer_ids)} {dtype} {hidden_size} (use a new --data directory)")
    return samples


def capture(
    data_dir: str | Path,
    backend: Backend,
    *,
    layer_ids: Sequence[int] | None = None,
    dtype: str = Capture.dtype,
    batch_size: int = Capture.batch_size,
    progress: bool | None = None,
    check_free_space: bool = True,
    shard: tuple[int, int] = (0, 1),
    log=print,
) -> dict:
    """Capture every sample of ``data_dir`` not captured yet; return the manifest's
    capture section (settings, per-sample entries, bytes on disk).

    ``shard = (i, n)``: only the samples whose index is i modulo n, so n engines (n
    processes, each with its own GPUs) capture one directory together; the manifest
    is updated under a lock from what is on disk, so the last shard to finish leaves
    it complete."""
    from tqdm import tqdm

    data_dir = Path(data_dir)
    all_samples = layout.read_samples(data_dir, tokens=False)
    if not all_samples:
        raise DataError(f"{data_dir / layout.SAMPLES}: no samples")
    i_shard, n_shards = shard
    samples = [s for s in all_samples if s.index % n_shards == i_shard]
    ids = check_layer_ids(layer_ids or default_layer_ids(backend.num_hidden_layers),
                          backend.num_hidden_layers)
    if dtype not in DTYPE_BYTES:
        raise DataError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    previous = layout.read_manifest(data_dir).get("capture")
    if previous and (previous.get("layer_ids") != ids or previous.get("dtype") != dtype):
        raise DataError(
            f"{data_dir / layout.MANIFEST}: captured with layer_ids {previous.get('layer_ids')} "
            f"dtype {previous.get('dtype')}; this run asks {ids} {dtype} (use a new directory)")
    h = backend.hidden_size
    records = layout.shard_records(data_dir)
    good = _verified(data_dir, samples, len(ids), h, records)
    present = [s for s in samples if s.index not in good
               and layout.hidden_path(data_dir, s.index).exists()]
    if present:
        log(f"capture: {len(present)} shard(s) differ from their recorded size and sha256 "
            f"or were never recorded (first: {layout.hidden_path(data_dir, present[0].index)}); "
            "capturing them again")
    todo = [s for s in samples if s.index not in good]
    need = estimate_disk(todo, len(ids), h, dtype)
    total = estimate_disk(samples, len(ids), h, dtype)
    free = shutil.disk_usage(data_dir).free
    log(f"capture: {len(samples)} samples, {sum(s.num_tokens for s in samples)} tokens, "
        f"{len(ids)} layers {ids} x {h} {dtype} = {bytes_per_token(len(ids), h, dtype)} B/token; "
        f"{human_bytes(total)} in total, {human_bytes(need)} still to write "
        f"({len(todo)} samples), {human_bytes(free)} free")
    if check_free_space and need > free:
        raise DataError(f"{data_dir}: {human_bytes(need)} needed, {human_bytes(free)} free")
    bar = tqdm(total=len(todo), desc="capture", unit="sample",
               disable=None if progress is None else not progress)
    t0 = time.perf_counter()
    for start in range(0, len(todo), batch_size):
        chunk = [layout.with_tokens(data_dir, s) for s in todo[start:start + batch_size]]
        paths = [layout.hidden_path(data_dir, s.index) for s in chunk]
        # a full disk: the shards of this chunk are removed (none is recorded), the
        # earlier ones stay recorded and a rerun resumes after them
        with disk_full_refusal(data_dir / layout.HIDDEN_DIR, estimate_disk(
                todo[start:], len(ids), h, dtype), cleanup=paths, what="writing shards"):
            backend.capture(chunk, ids, paths, dtype)
            written = [layout.shard_record(data_dir, s.index) for s in chunk]
            with layout.manifest_lock(data_dir):  # other --shard processes append too
                layout.append_shard_records(data_dir, written)
        bar.update(len(chunk))
    bar.close()
    elapsed = time.perf_counter() - t0
    with layout.manifest_lock(data_dir), disk_full_refusal(
            data_dir / layout.MANIFEST, None, what="writing the manifest"):
        return _write_capture_section(data_dir, backend, all_samples, todo, ids, h, dtype,
                                      elapsed)


def _write_capture_section(data_dir, backend, samples, todo, ids, h, dtype, elapsed) -> dict:
    """The manifest's capture section from the shards on disk (all shards' samples) that
    have a size and sha256 record (this process's, or another --shard process's)."""
    records = layout.shard_records(data_dir)
    done = [s for s in samples if s.index in records
            and layout.captured(data_dir, s, len(ids), h)]
    entries = [{"index": s.index, "prompt_hash": s.prompt_hash, "source": s.source,
                "file": str(layout.hidden_path(data_dir, s.index).relative_to(data_dir)),
                "shape": [s.num_tokens, len(ids), h], "loss_tokens": s.num_loss_tokens,
                "bytes": records[s.index]["bytes"], "sha256": records[s.index]["sha256"],
                "finite": records[s.index].get("finite")}
               for s in done]
    section = dict(backend.description, layer_ids=ids, aux_layer_ids=ids[:-1],
                   last_layer_id=ids[-1], dtype=dtype, hidden_size=h,
                   num_hidden_layers=backend.num_hidden_layers,
                   bytes_per_token=bytes_per_token(len(ids), h, dtype),
                   disk_bytes=estimate_disk(done, len(ids), h, dtype),
                   measured={"tokens": sum(s.num_tokens for s in todo),
                             "seconds": round(elapsed, 3)},
                   samples=entries)
    layout.update_manifest(data_dir, capture=section)
    return section


# --------------------------------------------------------------------------- #
# transformers                                                                 #
# --------------------------------------------------------------------------- #


class TransformersCapture:
    """Hidden states of a transformers causal LM, one forward per sample."""

    def __init__(self, model, *, name: str = ""):
        self.model = model.eval()
        cfg = (model.config.get_text_config() if hasattr(model.config, "get_text_config")
            else model.config)
        self.hidden_size = int(cfg.hidden_size)
        self.num_hidden_layers = int(cfg.num_hidden_layers)
        self.description = {"backend": "transformers", "target": name,
                            "tensor_parallel_size": 1}

    def _final_norm(self):
        decoder = (self.model.get_decoder() if hasattr(self.model, "get_decoder") else
            self.model.model)
        norm = getattr(decoder, "norm", None)
        if norm is None:
            raise DataError(f"{type(self.model).__name__}: no final norm found to read the "
                            "last layer's hidden state from")
        return norm

    def hidden_states(self, input_ids: list[int], layer_ids: list[int]):
        """``[tokens, len(layer_ids), hidden]`` (float32) for one sequence."""
        import torch

        seen = {}
        handle = self._final_norm().register_forward_pre_hook(
            lambda _m, args: seen.__setitem__("last", args[0].detach()))
        try:
            with torch.no_grad():
                out = self.model(torch.tensor([input_ids]), output_hidden_states=True,
                                 use_cache=False)
        finally:
            handle.remove()
        states = []
        for i in layer_ids:
            states.append(seen["last"][0] if i == self.num_hidden_layers
                          else out.hidden_states[i][0])
        return torch.stack(states, dim=1).float()

    def capture(self, samples: Sequence[Sample], layer_ids: list[int],
                paths: Sequence[Path], dtype: str) -> None:
        import torch

        for s, path in zip(samples, paths):
            hs = self.hidden_states(s.input_ids, layer_ids).to(getattr(torch, dtype))
            _save_shard(path, hs, torch.tensor(s.input_ids, dtype=torch.long))


# --------------------------------------------------------------------------- #
# vLLM 0.34.0: extract_hidden_states + ExampleHiddenStatesConnector            #
# --------------------------------------------------------------------------- #


def vllm_engine_kwargs(target: str, layer_ids: Sequence[int], staging_dir: str | Path, *,
                       tensor_parallel_size: int,
                       max_model_len: int | None = None,
                       **extra) -> dict:
    """``vllm.LLM`` / ``EngineArgs`` keyword arguments that make vLLM 0.34.0 write the
    given layers' hidden states of every request to ``staging_dir`` (prompt tokens only:
    a sample's whole token sequence is sent as the prompt, one token generated)."""
    kwargs = dict(
        model=str(target),
        tensor_parallel_size=tensor_parallel_size,
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {
                "hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
        },
        kv_transfer_config={
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(staging_dir),
                                          "allow_custom_save_path": True},
        },
        enable_prefix_caching=False,
    )
    if max_model_len:
        kwargs["max_model_len"] = max_model_len
    kwargs.update(extra)
    return kwargs


class VllmCapture:
    """vLLM's own hidden-state extraction at the target's tensor-parallel size (CUDA).

    ``llm`` is a ``vllm.LLM`` built with :func:`vllm_engine_kwargs`; the connector
    writes each request's states to the path the request names, which is renamed into
    the data directory once the token ids are checked.
    """

    def __init__(self, llm, *, target: str, staging_dir: str | Path,
                 tensor_parallel_size: int):
        self.llm = llm
        self.staging_dir = Path(staging_dir)
        cfg = llm.llm_engine.model_config
        self.hidden_size = int(cfg.get_hidden_size())
        self.num_hidden_layers = int(cfg.get_total_num_hidden_layers())
        self.description = {"backend": "vllm-extract_hidden_states", "target": target,
                            "tensor_parallel_size": tensor_parallel_size}

    def capture(self, samples: Sequence[Sample], layer_ids: list[int],
                paths: Sequence[Path], dtype: str) -> None:
        import torch
        from vllm import SamplingParams
        from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector

        staged = [self.staging_dir / f"hs_{s.index}.safetensors" for s in samples]
        params = [SamplingParams(max_tokens=1, temperature=0.0, extra_args={
            "kv_transfer_params": {"hidden_states_path": str(p)}}) for p in staged]
        outputs = self.llm.generate([{"prompt_token_ids": s.input_ids} for s in samples],
                                    params, use_tqdm=False)
        for s, out, path in zip(samples, outputs, paths):
            src = out.kv_transfer_params["hidden_states_path"]
            data = example_hidden_states_connector.load_hidden_states(src)
            if data["token_ids"].tolist() != s.input_ids:
                raise DataError(f"{src}: token ids differ from sample {s.index}")
            if tuple(data["hidden_states"].shape) != (s.num_tokens, len(layer_ids),
                                                      self.hidden_size):
                raise DataError(f"{src}: hidden_states shape "
                                f"{tuple(data['hidden_states'].shape)}, expected "
                                f"{(s.num_tokens, len(layer_ids), self.hidden_size)}")
            if data["hidden_states"].dtype == getattr(torch, dtype):
                try:  # the connector's file is already a shard: rename it
                    path.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(src, path)
                    os.chmod(path, file_mode())  # the connector's file may be 0600
                    example_hidden_states_connector.cleanup_hidden_states(src)
                    continue
                except OSError:  # another filesystem: rewrite below
                    pass
            _save_shard(path, data["hidden_states"].to(getattr(torch, dtype)),
                        data["token_ids"].long())
            example_hidden_states_connector.cleanup_hidden_states(src)

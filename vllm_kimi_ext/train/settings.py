"""Every tunable setting of the training commands, defined once.

A setting is a dataclass field made by :func:`setting`: its default, its help and, where
the name alone does not say it, its flag. ``vllm-kimi-ext draft ...`` generates its flags
from these classes (:func:`add_flags`) and turns the parsed arguments back into them
(:func:`from_args`); the library functions take the classes or use their defaults
(``batch_size: int = Capture.batch_size``). So a default is written in one place, and the
``--help`` text shows it.

Standard library and the cost model's CLI module only: the CLI imports this module while
building its parser.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from vllm_kimi_ext.costmodel.catalog import DEFAULT_HARDWARE
from vllm_kimi_ext.facts import target_dims
from vllm_kimi_ext.user_input import bounded_float, bounded_int

_VOCAB = target_dims().vocab_size  # the eval chunk's help prices Kimi-K2.5's vocabulary

__all__ = [
    "Bill",
    "Capture",
    "Evaluation",
    "Holdout",
    "Regeneration",
    "Sampling",
    "TrainConfig",
    "add_flags",
    "from_args",
    "setting",
]

#: the parsing type of each annotation a setting may have (``X | None``: the value may be
#: absent, which only the default can be)
_TYPES = {"int": int, "float": float, "str": str}


def setting(default: Any, help: str, *, flag: str | None = None, **argparse_kw: Any):
    """A field that is a command-line setting: ``flag`` defaults to ``--field-name``;
    ``argparse_kw`` (``choices``, ``type``, ``metavar``, ...) go to ``add_argument``."""
    return dataclasses.field(default=default, metadata={
        "help": help, "flag": flag, "argparse": argparse_kw})


def _flag(field: dataclasses.Field) -> str:
    return field.metadata["flag"] or "--" + field.name.replace("_", "-")


def _parse_type(field: dataclasses.Field):
    base = str(field.type).removesuffix(" | None")
    if base not in _TYPES:
        raise TypeError(f"{field.name}: no command-line type for annotation {field.type!r}")
    return _TYPES[base]


def add_flags(parser: argparse.ArgumentParser, cls: type, *,
              only: tuple[str, ...] | None = None) -> None:
    """One ``add_argument`` per setting of ``cls`` (``only``: just these fields); fields
    made without :func:`setting` are not flags."""
    for field in dataclasses.fields(cls):
        if "help" not in field.metadata or (only is not None and field.name not in only):
            continue
        kw = dict(field.metadata["argparse"])
        kw.setdefault("type", _parse_type(field))
        shown = "" if field.default is None else f" (default: {field.default})"
        parser.add_argument(_flag(field), dest=field.name, default=field.default,
                            help=field.metadata["help"] + shown, **kw)


def from_args(cls: type, args: argparse.Namespace, **extra: Any):
    """``cls`` from the parsed arguments (its settings that were flags) and ``extra``."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
              if "help" in f.metadata and hasattr(args, f.name)}
    return cls(**values, **extra)


def _device(text: str) -> str:
    """An argparse type: ``cpu``, ``cuda`` or ``cuda:N``."""
    import re

    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


# --------------------------------------------------------------------------- #
# the settings                                                                 #
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the target answers the prompts (``draft regenerate``)."""

    max_tokens: int = setting(2048, "largest response, in tokens")
    temperature: float = setting(1.0, "sampling temperature")
    top_p: float = setting(0.95, "nucleus sampling threshold")
    seed: int = setting(0, "sampling seed")


@dataclasses.dataclass(frozen=True)
class Regeneration:
    """How many requests ``draft regenerate`` keeps going."""

    batch_size: int = setting(64, "requests per batch with --hf-model (a batch is stored "
                                  "before the next; --server keeps --concurrency in flight)")
    concurrency: int = setting(32, "requests in flight to --server at once (each "
                                   "conversation stored as soon as it is done)")


@dataclasses.dataclass(frozen=True)
class Capture:
    """How ``draft capture`` runs the target."""

    tensor_parallel_size: int | None = setting(
        None, "vLLM tensor-parallel size of --vllm-target (default: every visible GPU, down "
        "to a count dividing the target's attention heads; 8 on the documented box)")
    dtype: str = setting("bfloat16", "dtype the hidden states are stored in",
                         choices=("bfloat16", "float16", "float32"))
    batch_size: int = setting(64, "samples per forward pass")


#: what a sample of a thinking-mode run holds: 8192 response tokens (the documented
#: `--max-tokens`) plus a prompt of up to 8192
LONG_SAMPLE = 16384


@dataclasses.dataclass
class TrainConfig:
    """The optimisation of ``draft train`` (``warmup_ratio``, ``log_every`` and ``resume``
    are not generated flags; ``--resume`` is a switch of its own)."""

    epochs: float = setting(1.0, "passes over the training samples")
    max_steps: int | None = setting(None, "stop after this many steps (overrides --epochs)")
    lr: float = setting(1e-3, "AdamW learning rate (speculators' default too)")
    warmup_ratio: float = 0.05
    max_len: int = setting(LONG_SAMPLE, "tokens packed per step and rank; a longer sample is "
                                        "cut, warned about and counted in training.json",
                           type=bounded_int(2, what="a token count"))
    min_train_tokens: int = setting(
        1, "refuse to train when fewer response tokens than this survive --max-len and "
           "--prompt-context (1: refuse only a run that would train on nothing)",
        metavar="N", type=bounded_int(1, what="a token count"))
    prompt_context: int | None = setting(
        None, "train on at most the last N prompt tokens of each sample")
    ttt_steps: int = setting(3, "draft depths trained (k)")
    seed: int = setting(0, "initialisation and data-order seed")
    device: str | None = setting(None, "torch device (default: cuda if available, else cpu)")
    log_every: int = 10
    checkpoint_every: int | None = setting(
        None, "write a checkpoint every N steps", metavar="N",
        type=bounded_int(1, what="a step count"))
    checkpoint_dir: str | None = setting(
        None, "where checkpoints go (default: OUT.checkpoints beside --out)")
    resume: bool = False
    val_fraction: float = setting(
        0.0, "share of conversations held out for validation; the exported head is the one "
             "with the lowest validation loss", type=bounded_float(0.0, 0.5, what="a fraction"))
    val_every: int | None = setting(
        None, "validate every N steps (default: once per epoch)", metavar="N",
        type=bounded_int(1, what="a step count"))
    patience: int | None = setting(
        None, "stop after this many validations without improvement",
        type=bounded_int(1, what="a count"))
    loader_workers: int | None = setting(
        None, "DataLoader workers (default: 2 on CUDA, 0 on CPU)",
        type=bounded_int(0, 64, what="a worker count"))


@dataclasses.dataclass(frozen=True)
class Holdout:
    """The held-out split ``draft train`` leaves out and ``draft eval`` scores."""

    holdout_every: int = setting(
        0, "hold out the samples whose prompt hash is 0 mod N (0: none)")


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """``draft eval``'s chain length, window and device."""

    k: int = setting(3, "draft tokens per step scored (tau at k)", flag="-k")
    max_len: int = setting(LONG_SAMPLE, "tokens of each sample evaluated; a longer sample is "
                                        "cut, warned about and counted",
                           type=bounded_int(2, what="a token count"))
    device: str | None = setting(None, "cpu, cuda or cuda:N (default: cuda in bf16 if "
                                       "available, else cpu in fp32)", type=_device)
    chunk: int = setting(
        1024, "chain starts scored at once: the scoring's peak memory is about 16 x CHUNK x "
              "vocab bytes whatever the sample's length "
              f"({16 * 1024 * _VOCAB / 1e9:.1f} GB at 1024 x Kimi-K2.5's {_VOCAB}), "
              "plus the draft's forward over the sample", metavar="CHUNK",
        type=bounded_int(1, what="a position count"))


@dataclasses.dataclass(frozen=True)
class Bill:
    """The box and comparison ``draft bill`` assumes when no pilot measured them."""

    hardware: str = setting(DEFAULT_HARDWARE, "hardware profile of the box (plan --list)")
    decode_batch: int = setting(64, "concurrent requests while regenerating")
    context: int = setting(4096, "context tokens per request while regenerating")
    alt_step_cost: float = setting(1.0, "the other draft's step time / today's")
    #: ASSUMPTION: one PCIe 4.0 x4 NVMe drive (vendor datasheets of current drives list
    #: ~7 GB/s sequential read); a RAID or a network store differs
    disk_read_gb_s: float = setting(
        7.0, "sequential read rate of the shard store in GB/s (assumed: one PCIe 4.0 x4 "
             "NVMe drive's datasheet rate); the bill flags a run the store bounds")

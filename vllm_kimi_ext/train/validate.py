"""Every input of ``draft regenerate | capture | train | eval | bill``, checked before work.

:func:`check_args` runs a command's rules in a fixed order, and all of them run before
any model, tokenizer or engine is built:

0. flags that must fit together (:data:`USAGE`: exactly one backend, ...);
1. numbers (:data:`NUMBERS`): finite, of the right sign, inside their bounds;
2. paths (:data:`PATHS`): exist, are readable, are a folder where a folder is needed,
   an output's nearest existing parent is writable;
3. outputs against inputs (:data:`OUTPUTS`): an output never equals, contains or lies
   inside an input; an existing non-empty output needs ``--force`` where the command
   has one;
4. the command's own checks (:data:`EXTRA`): checkpoint code (``auto_map``) needs
   ``--trust-remote-code``, devices and layer ids fit the target's config, data
   directories hold what the command reads.

Each refusal is a :class:`~vllm_kimi_ext.user_input.UserInputError` whose message is one
line naming the flag (or file) and what was expected; the CLI prints it and exits 2.
The tables are keyed by argparse ``dest``: a new flag gets its row here, nothing else.

Standard library only at import; torch is imported to check ``--device`` only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vllm_kimi_ext.user_input import MAX_VOCAB_SIZE, UsageError, UserInputError

__all__ = ["EXTRA", "NUMBERS", "OUTPUTS", "PATHS", "USAGE", "Num", "check_args", "check_numbers",
           "check_outputs", "check_paths", "flag_name",
           "needs_remote_code", "require_remote_code_opt_in", "strict_json"]

#: argparse dests whose option string is not ``--`` + dest with dashes.
_FLAG_NAMES = {"k": "-k"}


def flag_name(dest: str) -> str:
    return _FLAG_NAMES.get(dest, "--" + dest.replace("_", "-"))


def _given(args: Any, dest: str) -> Any:
    return getattr(args, dest, None)


# --------------------------------------------------------------------------- #
# 1. numbers                                                                   #
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class Num:
    """A number's rule: its type and bounds (``None``: unbounded; ``*_open``: strict)."""

    kind: type = int
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    note: str = ""  # what the value means, appended to the expectation

    def expected(self) -> str:
        what = "an integer" if self.kind is int else "a finite number"
        if self.lo is not None and self.hi is not None:
            what += (f" in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}"
                     f"{')' if self.hi_open else ']'}")
        elif self.lo is not None:
            what += f" {'>' if self.lo_open else '>='} {_num(self.lo)}"
        elif self.hi is not None:
            what += f" {'<' if self.hi_open else '<='} {_num(self.hi)}"
        return what + (f" ({self.note})" if self.note else "")

    def ok(self, value: Any) -> bool:
        if isinstance(value, bool):
            return False
        if self.kind is int and not isinstance(value, int):
            return False
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return not (self.hi is not None and (value >= self.hi if self.hi_open
                                             else value > self.hi))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


_SEED = Num(int, 0, 2**32 - 1)
_POSITIVE = Num(float, 0, lo_open=True)
_COUNT = Num(int, 1)
#: a step count or interval: at most a billion steps (more is a typo, never a plan)
MAX_STEPS = 10**9
_STEPS = Num(int, 1, MAX_STEPS)
_HOLDOUT = Num(int, 0, note="0 keeps every sample; N >= 2 holds out about 1 in N")
_TAU = Num(float, 1, note="tokens per target step, 1 = no speculation")

#: command -> dest -> rule; ``None`` (unset) always passes.
NUMBERS: dict[str, dict[str, Num]] = {
    "regenerate": {
        "limit": _COUNT, "concurrency": _COUNT, "max_tokens": _COUNT, "batch_size": _COUNT,
        "temperature": Num(float, 0), "top_p": Num(float, 0, 1, lo_open=True), "seed": _SEED,
    },
    "capture": {
        "tensor_parallel_size": _COUNT, "max_model_len": _COUNT, "batch_size": _COUNT,
    },
    "train": {
        "draft_vocab_size": _COUNT, "epochs": _POSITIVE,
        "max_steps": Num(int, 0, MAX_STEPS,
                         note="unset: --epochs decides; 0 exports --init as is"),
        "lr": Num(float, 0, 1, lo_open=True), "max_len": Num(int, 2), "prompt_context":
        Num(int, 0), "ttt_steps": Num(int, 1, 64), "seed": _SEED, "holdout_every": _HOLDOUT,
        "checkpoint_every": _STEPS, "val_fraction": Num(float, 0, 0.5), "val_every": _STEPS,
        "patience": _STEPS, "loader_workers": Num(int, 0, 64), "min_train_tokens": _COUNT,
    },
    "eval": {"k": Num(int, 1, 64), "holdout_every": _HOLDOUT, "max_len": Num(int, 2),
             "chunk": _COUNT},
    "bill": {
        "prompts": _COUNT, "gain_fraction": Num(float, 0, 1, lo_open=True, hi_open=True),
        "n_half": _POSITIVE, "prompt_tokens": _POSITIVE, "response_tokens": _POSITIVE,
        "decode_batch": _COUNT, "context": _COUNT, "decode_tok_s": _POSITIVE,
        "prefill_tok_s": _POSITIVE, "ttt_steps": Num(int, 1, 64), "epochs": _POSITIVE,
        "tau_now": _TAU, "tau_after": _TAU, "tau_alt": _TAU, "alt_step_cost": _POSITIVE,
        "disk_read_gb_s": _POSITIVE, "max_len": Num(int, 2),
    },
}


def check_numbers(command: str, args: Any) -> None:
    for dest, rule in NUMBERS.get(command, {}).items():
        value = _given(args, dest)
        if value is not None and not rule.ok(value):
            flag = flag_name(dest)
            raise UserInputError(f"{flag} {value}: expected {rule.expected()}", field=flag,
                                 expected=rule.expected())


# --------------------------------------------------------------------------- #
# 2. paths                                                                     #
# --------------------------------------------------------------------------- #


def _refuse(flag: str, path: Any, what: str) -> UserInputError:
    return UserInputError(f"{flag} {path}: {what}", file=str(path), field=flag, expected=what)


def _readable_file(flag: str, path: Path) -> None:
    if not path.exists():
        raise _refuse(flag, path, "no such file")
    if path.is_dir():
        raise _refuse(flag, path, "is a folder, expected a file")
    if not os.access(path, os.R_OK):
        raise _refuse(flag, path, "not readable")


def _readable_dir(flag: str, path: Path, needs: str | None = None) -> None:
    if not path.exists():
        raise _refuse(flag, path, "no such folder")
    if not path.is_dir():
        raise _refuse(flag, path, "is a file, expected a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise _refuse(flag, path, "folder not readable")
    if needs and not (path / needs).is_file():
        raise _refuse(flag, path, f"no {needs} in this folder")


def _writable_dir(flag: str, path: Path) -> None:
    """A folder this command may create or write into: not a file, and its nearest
    existing ancestor is a writable folder."""
    if path.exists() and not path.is_dir():
        raise _refuse(flag, path, "is a file, expected a folder (new or existing)")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise _refuse(flag, path, f"{probe} is a file, so this folder cannot be created")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise _refuse(flag, path, f"{probe} is not writable")


_PATH_CHECKS: dict[str, Callable[[str, Path], None]] = {
    "file": _readable_file,
    "dir": _readable_dir,
    "model": lambda f, p: _readable_dir(f, p, "config.json"),
    "data": lambda f, p: _readable_dir(f, p, "samples.jsonl"),
    "out": _writable_dir,
}

#: command -> dest -> kind (a list-valued dest is checked item by item).
PATHS: dict[str, dict[str, str]] = {
    "regenerate": {"prompts": "file", "hf_model": "model", "out": "out"},
    "capture": {"data": "data", "vllm_target": "model", "hf_model": "model",
                "staging": "out"},
    "train": {"data": "data", "target": "model", "init": "model",
              "draft_vocab_from": "dir", "out": "out"},
    "eval": {"data": "data", "target": "model", "draft": "model"},
    "bill": {"measured": "data", "measured_train": "file"},
}


def _paths_of(value: Any) -> list[Path]:
    if value is None:
        return []
    return [Path(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def check_paths(command: str, args: Any) -> None:
    for dest, kind in PATHS.get(command, {}).items():
        value = _given(args, dest)
        for raw in (value if isinstance(value, (list, tuple)) else [value]):
            if raw is not None and str(raw).strip() == "":
                raise UserInputError(f"{flag_name(dest)}: empty path", field=flag_name(dest))
        for path in _paths_of(value):
            _PATH_CHECKS[kind](flag_name(dest), path)
    gguf = _given(args, "gguf_file")
    if gguf is not None:
        model = _given(args, "hf_model")
        if model is None:
            raise UsageError("--gguf-file needs --hf-model (the folder holding it)",
                             field="--gguf-file")
        _readable_file("--gguf-file", Path(model) / gguf)


# --------------------------------------------------------------------------- #
# 3. outputs against inputs                                                    #
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class Output:
    dest: str
    inputs: tuple[str, ...]
    #: "force": an existing non-empty folder needs --force; "data": it must be a data
    #: directory (resumed) or empty; "checkpoints": it may hold only checkpoint folders;
    #: "": no rule
    existing: str = ""
    #: other outputs of the same command it must not equal, contain or lie inside
    apart_from: tuple[str, ...] = ()
    #: where the output goes when its flag is not given (``None``: nowhere)
    default: Callable[[Any], Path | None] | None = None


def _train_checkpoints(args: Any) -> Path | None:
    """``draft train``'s checkpoint folder when --checkpoint-dir is not given."""
    if (not (_given(args, "checkpoint_every") or _given(args, "resume")) or
            _given(args, "out") is None):
        return None
    from .trainer import default_checkpoint_dir

    return default_checkpoint_dir(args.out)


_TRAIN_INPUTS = ("target", "init", "data", "draft_vocab_from")
#: every path a command writes, against every path it reads and every other output
OUTPUTS: dict[str, tuple[Output, ...]] = {
    "regenerate": (Output("out", ("prompts", "hf_model"), existing="data"),),
    "capture": (Output("data", ("vllm_target", "hf_model")),
                Output("staging", ("vllm_target", "hf_model"))),
    "train": (Output("out", _TRAIN_INPUTS, existing="force", apart_from=("checkpoint_dir",)),
              Output("checkpoint_dir", _TRAIN_INPUTS, existing="checkpoints",
                     apart_from=("out",), default=_train_checkpoints)),
}


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _overlap(out: Path, inp: Path) -> str | None:
    o, i = _resolved(out), _resolved(inp)
    if o == i:
        return "is the same path as"
    if o in i.parents:
        return "contains"
    if i in o.parents:
        return "lies inside"
    return None


def _output_path(args: Any, rule: Output) -> tuple[Path, str] | None:
    """``(path, how it is named)`` of an output: its flag's value, else its default."""
    value = _given(args, rule.dest)
    if value is not None:
        return Path(value), flag_name(rule.dest)
    path = rule.default(args) if rule.default else None
    return (path, f"{flag_name(rule.dest)} (default)") if path is not None else None


def check_outputs(command: str, args: Any) -> None:
    """No output equals, contains or lies inside an input or another output of the
    command; an existing output holds what the rule allows."""
    rules = {r.dest: r for r in OUTPUTS.get(command, ())}
    for rule in rules.values():
        where = _output_path(args, rule)
        if where is None:
            continue
        out, flag = where
        against = [("input", flag_name(d), p) for d in rule.inputs
                   for p in _paths_of(_given(args, d))]
        for d in rule.apart_from:
            other = _output_path(args, rules[d]) if d in rules else None
            if other is not None:
                against.append(("output", other[1], other[0]))
        for kind, name, other in against:
            how = _overlap(out, other)
            if how:
                raise UserInputError(
                    f"{flag} {out} {how} {name} {other}: an output must not overwrite an "
                    f"{kind}; pick another folder", file=str(out), field=flag.split()[0],
                    expected="a folder apart from every input and every other output")
        _check_existing(rule, out, flag, args)


def _check_existing(rule: Output, out: Path, flag: str, args: Any) -> None:
    if not out.is_dir() or not any(out.iterdir()):
        return
    field = flag.split()[0]
    if rule.existing == "force" and not _given(args, "force"):
        raise UserInputError(f"{flag} {out}: exists and is not empty; pass --force to "
                             "replace it (the old one stays until the new one is complete)",
                             file=str(out), field=field, expected="a new or empty folder")
    if rule.existing == "data" and not ((out / "samples.jsonl").is_file()
                                        or (out / "manifest.json").is_file()):
        raise UserInputError(f"{flag} {out}: not empty and not a data directory (no "
                             "samples.jsonl); pick a new folder, or an earlier run's to "
                             "resume it", file=str(out), field=field,
                             expected="a new, empty or data directory")
    if rule.existing == "checkpoints":
        from .runstate import foreign_entries

        foreign = foreign_entries(out)
        if foreign:
            raise UserInputError(
                f"{flag} {out}: holds {foreign[0]!r}{' and more' if len(foreign) > 1 else ''}, "
                "not only `draft train` checkpoints (old ones there are pruned); pick a new "
                "or empty folder", file=str(out), field=field,
                expected="a new, empty or checkpoint folder")


# --------------------------------------------------------------------------- #
# 4. checkpoint code, devices, layer ids, data                                 #
# --------------------------------------------------------------------------- #


def _json_file(path: Path, flag: str) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise _refuse(flag, path, f"cannot read ({exc})") from None
    except ValueError as exc:
        raise _refuse(flag, path, f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _refuse(flag, path, f"holds a JSON {type(value).__name__}, expected an object")
    return value


def needs_remote_code(folder: str | Path) -> list[str]:
    """The files of a checkpoint folder that make transformers run the folder's own
    Python code (an ``auto_map`` in its config or tokenizer config)."""
    found = []
    for name in ("config.json", "tokenizer_config.json", "processor_config.json"):
        path = Path(folder) / name
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if isinstance(cfg, dict) and (cfg.get("auto_map") or (
                isinstance(cfg.get("text_config"), dict) and cfg["text_config"].get("auto_map"))):
            found.append(name)
    return found


def require_remote_code_opt_in(flag: str, folder: str | Path | None, allowed: bool) -> None:
    if folder is None or allowed:
        return
    files = needs_remote_code(folder)
    if files:
        raise UserInputError(
            f"{flag} {folder}: its {files[0]} names custom code (auto_map) that would run "
            "on load; pass --trust-remote-code if you trust this checkpoint",
            file=str(Path(folder) / files[0]), field="--trust-remote-code",
            expected="--trust-remote-code for checkpoints with their own code")


def _remote_code(flags: Iterable[str]):
    def check(args: Any) -> None:
        for dest in flags:
            for folder in _paths_of(_given(args, dest)):
                require_remote_code_opt_in(flag_name(dest), folder,
                                           bool(_given(args, "trust_remote_code")))
    return check


def target_config(flag: str, folder: str | Path) -> dict:
    """The (text) config of a target folder, with the fields the commands need checked."""
    path = Path(folder) / "config.json"
    cfg = _json_file(path, flag)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    for key in ("num_hidden_layers", "hidden_size", "vocab_size"):
        value = text.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserInputError(
                f"{flag} {folder}: config.json field {key!r} is {value!r}, expected an "
                "integer >= 1", file=str(path), field=key, expected="an integer >= 1")
    if text["vocab_size"] > MAX_VOCAB_SIZE:
        raise UserInputError(f"{flag} {folder}: config.json vocab_size {text['vocab_size']} "
                             f"exceeds {MAX_VOCAB_SIZE}", file=str(path), field="vocab_size")
    return text


def check_device(device: str | None) -> None:
    """``--device``: cpu, cuda, cuda:N (N below the visible GPU count) or mps."""
    if device is None:
        return
    text = device.strip().lower()
    kind, _, index = text.partition(":")
    if (kind not in ("cpu", "cuda", "mps") or (index and not index.isdigit()) or
            (index and kind != "cuda")):
        raise UserInputError(f"--device {device!r}: expected cpu, cuda, cuda:N or mps",
                             field="--device")
    if kind == "cuda":
        count = _visible_gpus()
        if count == 0:
            raise UserInputError(f"--device {device}: no CUDA GPU is visible; use --device cpu "
                                 "or leave it unset", field="--device")
        if index and int(index) >= count:
            raise UserInputError(f"--device {device}: {count} CUDA GPU(s) visible, expected "
                                 f"cuda:0 .. cuda:{count - 1}", field="--device")


def _visible_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _one_of(args: Any, a: str, b: str) -> None:
    if bool(_given(args, a)) == bool(_given(args, b)):
        raise UsageError(f"give exactly one of {flag_name(a)}, {flag_name(b)}",
                         field=flag_name(a))


def _check_regenerate(args: Any) -> None:
    server = _given(args, "server")
    if server is not None and not str(server).startswith(("http://", "https://")):
        raise UserInputError(f"--server {server!r}: expected an http:// or https:// base URL, "
                             "e.g. http://localhost:8000/v1", field="--server")
    if _given(args, "hf_model"):
        require_remote_code_opt_in("--hf-model", args.hf_model,
                                   bool(_given(args, "trust_remote_code")))
    out = Path(args.out)
    from .regenerate import check_resume

    check_resume(out, "transformers" if _given(args, "hf_model") else "openai-server",
                 _given(args, "hf_model") or _given(args, "model"))


def _check_capture(args: Any) -> None:
    folder = _given(args, "vllm_target") or _given(args, "hf_model")
    flag = "--vllm-target" if _given(args, "vllm_target") else "--hf-model"
    require_remote_code_opt_in(flag, folder, bool(_given(args, "trust_remote_code")))
    from .capture import check_capture_data, check_layer_ids, default_layer_ids

    if _given(args, "hf_model") and _given(args, "gguf_file"):
        # the depth and vocabulary are inside the GGUF file: checked once it is read
        check_capture_data(args.data, None, None, args.dtype)
        return
    cfg = target_config(flag, folder)
    n = cfg["num_hidden_layers"]
    # not given: an earlier capture's ids (a resume), else the default derived from the
    # target; so only a given --layer-ids can be wrong, and only it is blamed
    if args.layer_ids is None:
        args.layer_ids = _resumed_layer_ids(args.data, n) or default_layer_ids(n)
    else:
        args.layer_ids = check_layer_ids(args.layer_ids, n)
    heads = cfg.get("num_attention_heads")
    tp = _given(args, "tensor_parallel_size")
    if _given(args, "vllm_target") and tp is not None and isinstance(heads, int) and heads % tp:
        raise UserInputError(f"--tensor-parallel-size {tp}: must divide the target's "
                             f"num_attention_heads ({heads})", field="--tensor-parallel-size")
    check_capture_data(args.data, cfg["vocab_size"], args.layer_ids, args.dtype,
                       cfg["hidden_size"])
    if _given(args, "vllm_target"):
        args.tensor_parallel_size = _check_gpus(tp, heads)


def _check_gpus(tp: int | None, heads: Any) -> int:
    """The tensor-parallel size: the given one if enough GPUs are visible, else (not
    given) every visible GPU, down to a count dividing the attention heads."""
    gpus = _visible_gpus()
    if tp is None:
        if gpus == 0:
            raise UserInputError("--vllm-target runs vLLM on CUDA GPUs and none is visible (on "
                                 "CPU use --hf-model)", field="--vllm-target")
        tp = gpus
        while isinstance(heads, int) and heads % tp:
            tp -= 1
        return tp
    if tp > gpus:
        raise UserInputError(f"--tensor-parallel-size {tp}: {gpus} CUDA GPU(s) visible; "
                             "--vllm-target needs one per rank (on CPU use --hf-model)",
                             field="--tensor-parallel-size")
    return tp


def _resumed_layer_ids(data: str, n: int) -> list[int] | None:
    """The layer ids an earlier capture of ``data`` used, when they fit a target of ``n``
    layers (else ``None``: the default applies, and the manifest check names the clash)."""
    from .layout import read_manifest

    ids = (read_manifest(data).get("capture") or {}).get("layer_ids")
    ok = (isinstance(ids, list) and len(ids) >= 2 and all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids) and
        ids == sorted(set(ids)) and ids[0] >= 0 and ids[-1] == n)
    return list(ids) if ok else None


def _check_json_layer(args: Any) -> None:
    from .bridge import check_layer_overrides

    check_layer_overrides(_given(args, "draft_layer"))


def _check_train(args: Any) -> None:
    _remote_code(("target", "init"))(args)
    check_device(_given(args, "device"))
    _check_json_layer(args)
    if args.max_len < args.ttt_steps + 2:
        raise UserInputError(f"--max-len {args.max_len}: expected >= --ttt-steps + 2 = "
                             f"{args.ttt_steps + 2} (a chain of k drafts needs k + 2 tokens)",
                             field="--max-len")
    if args.max_steps == 0 and not args.init:
        raise UserInputError("--max-steps 0: exports --init without training, but no --init "
                             "is given (an untrained head); expected N >= 1 or unset",
                             field="--max-steps")
    if args.holdout_every == 1:
        raise UserInputError("--holdout-every 1: would hold out every sample, leaving none to "
                             "train on; expected 0 or N >= 2", field="--holdout-every")
    cfg = target_config("--target", args.target)
    if args.draft_vocab_size is not None and args.draft_vocab_size > cfg["vocab_size"]:
        raise UserInputError(f"--draft-vocab-size {args.draft_vocab_size}: expected <= the "
                             f"target's vocab_size {cfg['vocab_size']}",
                             field="--draft-vocab-size")
    from .runstate import world_size_from_env
    from .trainer import check_train_data

    world_size_from_env()  # a WORLD_SIZE without the rest of a torchrun launch
    check_train_data(args.data, cfg, flag="--data", rehash=bool(_given(args, "rehash_shards")))


def _check_eval(args: Any) -> None:
    _remote_code(("target", "draft"))(args)
    check_device(_given(args, "device"))
    cfg = target_config("--target", args.target)
    from .trainer import check_train_data

    check_train_data(args.data, cfg, flag="--data", rehash=bool(_given(args, "rehash_shards")))


def _eval_usage(args: Any) -> None:
    if args.split != "all" and not args.holdout_every:
        raise UsageError(f"--split {args.split}: needs --holdout-every N (which samples are "
                         "held out)", field="--split")
    if len(set(map(str, args.draft))) != len(args.draft):
        raise UsageError("--draft: the same draft is given twice", field="--draft")


def _train_usage(args: Any) -> None:
    """The long-run flags: validation settings need a split, a checkpoint folder needs
    checkpoints (or ``--resume``) and must be a folder."""
    if ((_given(args, "val_every") or _given(args, "patience")) and
            not _given(args, "val_fraction")):
        flag = "--val-every" if _given(args, "val_every") else "--patience"
        raise UsageError(f"{flag} needs --val-fraction (a validation split)",
                         field=flag, expected="--val-fraction > 0")
    ckpt = _given(args, "checkpoint_dir")
    if ckpt and not (_given(args, "checkpoint_every") or _given(args, "resume")):
        raise UsageError("--checkpoint-dir needs --checkpoint-every or --resume",
                         field="--checkpoint-dir", expected="--checkpoint-every N")
    if ckpt and Path(ckpt).exists() and not Path(ckpt).is_dir():
        raise UsageError(f"--checkpoint-dir {ckpt}: is a file, expected a folder",
                         field="--checkpoint-dir", expected="a folder")


def _bill_usage(args: Any) -> None:
    if (_given(args, "prompts") is None) == (_given(args, "gain_fraction") is None):
        raise UsageError("give exactly one of --prompts, --gain-fraction", field="--prompts")
    if _given(args, "n_half") is not None and _given(args, "gain_fraction") is None:
        raise UsageError("--n-half applies to --gain-fraction only", field="--n-half")
    if (_given(args, "tau_now") is None) != (_given(args, "tau_after") is None):
        missing = "--tau-after" if _given(args, "tau_after") is None else "--tau-now"
        raise UsageError(f"{missing} is needed too: the comparison needs --tau-now and "
                         "--tau-after", field=missing)
    if _given(args, "tau_alt") is not None and _given(args, "tau_now") is None:
        raise UsageError("--tau-alt needs --tau-now and --tau-after", field="--tau-alt")


#: command -> flags that must fit together, checked first.
USAGE: dict[str, tuple[Callable[[Any], None], ...]] = {
    "regenerate": (lambda a: _one_of(a, "server", "hf_model"),),
    "capture": (lambda a: _one_of(a, "vllm_target", "hf_model"),),
    "train": (_train_usage,),
    "eval": (_eval_usage,),
    "bill": (_bill_usage,),
}

#: command -> its own checks, run after numbers, paths and outputs.
EXTRA: dict[str, tuple[Callable[[Any], None], ...]] = {
    "regenerate": (_check_regenerate,),
    "capture": (_check_capture,),
    "train": (_check_train,),
    "eval": (_check_eval,),
}


def check_args(command: str, args: Any) -> None:
    """Every rule of ``command`` against parsed ``args``; raises the first refusal."""
    for usage in USAGE.get(command, ()):
        usage(args)
    check_numbers(command, args)
    check_paths(command, args)
    check_outputs(command, args)
    for check in EXTRA.get(command, ()):
        check(args)


# --------------------------------------------------------------------------- #
# output                                                                       #
# --------------------------------------------------------------------------- #


def strict_json(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` whose output every JSON parser reads: NaN and infinities become
    ``null`` (:func:`~vllm_kimi_ext.jsonsafe.strict`;
    ``allow_nan=False`` proves none is left)."""
    from vllm_kimi_ext.jsonsafe import strict

    return json.dumps(strict(obj), allow_nan=False, **kwargs)

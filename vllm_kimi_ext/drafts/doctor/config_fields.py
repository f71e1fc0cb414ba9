"""The ``config.json`` fields the draft doctor reads, with the type each must have.

:func:`validated_config` checks a config against :data:`FIELDS` (top level and
``text_config``) and :data:`NESTED` (fields inside sub-objects) and returns a copy
without the invalid values plus the problems, each naming the field, what was expected
and what was found. The doctor's checks then read only well-typed values: a wrong type
is reported once, as its own finding, instead of crashing a check or silently skipping it.

Standard library only.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any

__all__ = ["FIELDS", "NESTED", "FieldProblem", "validated_config"]


@dataclasses.dataclass(frozen=True)
class Kind:
    expected: str  # what a valid value is, in words
    ok: Callable[[Any], bool]


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return (_int(v) or isinstance(v, float)) and math.isfinite(v)


POSITIVE_INT = Kind("a positive integer", lambda v: _int(v) and v > 0)
NON_NEGATIVE_INT = Kind("a non-negative integer", lambda v: _int(v) and v >= 0)
INT = Kind("an integer", _int)
POSITIVE_NUMBER = Kind("a positive finite number", lambda v: _number(v) and v > 0)
STRING = Kind("a string", lambda v: isinstance(v, str))
BOOL = Kind("true or false", lambda v: isinstance(v, bool))
OBJECT = Kind("an object", lambda v: isinstance(v, dict))
OBJECT_OR_NULL = Kind("an object or null", lambda v: v is None or isinstance(v, dict))
INT_LIST = Kind("a list of integers", lambda v: isinstance(v, list) and all(map(_int, v)))
CLASS_NAMES = Kind("a non-empty list of class names (strings)",
                   lambda v: isinstance(v, list) and bool(v) and all(isinstance(a, str) and a
                                                                    for a in v))
STRING_LIST = Kind("a list of strings",
                   lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v))
TOKEN_IDS = Kind("a token id, a list of token ids, or null",
                 lambda v: v is None or _int(v) or (isinstance(v, list)
                                                   and all(x is None or _int(x) for x in v)))

#: Fields read at the top level of a config and of its ``text_config``.
FIELDS: dict[str, Kind] = {
    "architectures": CLASS_NAMES,
    "model_type": STRING,
    "vocab_size": POSITIVE_INT,
    "draft_vocab_size": POSITIVE_INT,
    "hidden_size": POSITIVE_INT,
    "target_hidden_size": POSITIVE_INT,
    "num_hidden_layers": POSITIVE_INT,
    "num_aux_hidden_states": POSITIVE_INT,
    "num_nextn_predict_layers": NON_NEGATIVE_INT,
    "max_position_embeddings": POSITIVE_INT,
    "rope_theta": POSITIVE_NUMBER,
    "rope_scaling": OBJECT_OR_NULL,
    "rope_parameters": OBJECT_OR_NULL,
    "bos_token_id": TOKEN_IDS,
    "eos_token_id": TOKEN_IDS,
    "pad_token_id": TOKEN_IDS,
    "mask_token_id": INT,
    "block_size": POSITIVE_INT,
    "eagle_aux_hidden_state_layer_ids": INT_LIST,
    "target_layer_ids": INT_LIST,
    "text_config": OBJECT,
    "eagle_config": OBJECT,
    "dflash_config": OBJECT,
    "quantization_config": OBJECT,
}
_ROPE = {"factor": POSITIVE_NUMBER, "original_max_position_embeddings": POSITIVE_INT,
         "rope_type": STRING, "type": STRING, "rope_theta": POSITIVE_NUMBER}
#: Fields read inside sub-objects.
NESTED: dict[str, dict[str, Kind]] = {
    "rope_scaling": _ROPE,
    "rope_parameters": _ROPE,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": INT_LIST, "layer_ids": INT_LIST,
                     "use_aux_hidden_state": BOOL},
    "dflash_config": {"mask_token_id": INT, "target_layer_ids": INT_LIST, "layer_ids": INT_LIST,
                      "block_size": POSITIVE_INT, "use_aux_hidden_state": BOOL},
    "quantization_config": {"quant_method": STRING, "ignore": STRING_LIST,
                            "config_groups": OBJECT},
}


@dataclasses.dataclass(frozen=True)
class FieldProblem:
    field: str  # dotted path, e.g. "rope_scaling.factor"
    expected: str
    value: Any

    def describe(self) -> str:
        shown = repr(self.value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return (f"{self.field} must be {self.expected}, got {shown} "
                f"({type(self.value).__name__})")


def _check(obj: dict, fields: dict[str, Kind], prefix: str, out: list[FieldProblem]) -> None:
    for name, kind in fields.items():
        if name not in obj:
            continue
        value = obj[name]
        if value is None and kind not in (OBJECT_OR_NULL, TOKEN_IDS):
            del obj[name]  # an explicit null reads as absent
            continue
        if not kind.ok(value):
            out.append(FieldProblem(prefix + name, kind.expected, value))
            del obj[name]
            continue
        sub = NESTED.get(name)
        if sub and isinstance(value, dict):
            _check(value, sub, f"{prefix}{name}.", out)


def _check_config_groups(cfg: dict, prefix: str, out: list[FieldProblem]) -> None:
    """``quantization_config.config_groups``: objects whose ``targets`` are strings."""
    groups = (cfg.get("quantization_config") or {}).get("config_groups")
    if not isinstance(groups, dict):
        return
    for key in list(groups):
        group = groups[key]
        path = f"{prefix}quantization_config.config_groups.{key}"
        if not isinstance(group, dict):
            out.append(FieldProblem(path, "an object", group))
            del groups[key]
        elif "targets" in group and not STRING_LIST.ok(group["targets"]):
            out.append(FieldProblem(path + ".targets", STRING_LIST.expected, group["targets"]))
            del group["targets"]


def validated_config(cfg: dict) -> tuple[dict, list[FieldProblem]]:
    """A deep copy of ``cfg`` without its ill-typed values, and what they were."""
    clean = copy.deepcopy(cfg)
    problems: list[FieldProblem] = []
    _check(clean, FIELDS, "", problems)
    _check_config_groups(clean, "", problems)
    text = clean.get("text_config")
    if isinstance(text, dict):
        _check(text, {k: v for k, v in FIELDS.items() if k != "text_config"}, "text_config.",
               problems)
        _check_config_groups(text, "text_config.", problems)
    return clean, problems

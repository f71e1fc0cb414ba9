"""Draft-checkpoint checks against a Kimi-K2.5 target, before anything is served.

``diagnose(target_dir, draft_dir)`` reads the two ``config.json`` files and the
draft's safetensors *headers* (names, dtypes, shapes, data offsets against the file
sizes; no weight is loaded, except the small ``d2t`` / ``t2d`` vocabulary maps whose
values are checked) and reports every way the pair is known to go wrong in vLLM
0.34.0, each as a :class:`~vllm_kimi_ext.findings.Finding` with a stable code, a
severity and a message that names the values involved (and ``file`` / ``field`` where
it is about one). Every code, its severity and meaning are listed in one table,
:data:`vllm_kimi_ext.drafts.doctor.codes.FINDING_CODES` (``vllm-kimi-ext doctor
--list-codes``, ``docs/doctor.md``).

What the doctor knows a draft is (:mod:`.draft_kinds`): EAGLE-3 needs an ``fc`` weight
and an EAGLE-3 architecture, DFlash a DFlash architecture, ``fc`` and its block config,
MTP its layers, ``draft_model`` a causal LM; a target passed as the draft, or the two
swapped, is named as such. Config values of the wrong type are reported once
(:mod:`.config_fields`) and a check whose inputs are missing is reported as a finding
(``E-CONFIG-MISSING``), never skipped silently.

Nothing here imports vLLM or torch; :func:`check_speculative_config` (the
plugin's configuration-time hook) lives in :mod:`vllm_kimi_ext.integration.draft_check`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_kimi_ext.checkpoints.safetensors_headers import (
    TensorIndex,
    WeightProblem,
    scan_weights,
)
from vllm_kimi_ext.findings import Finding

from .checks import (
    CACHE_ONLY_ROPE_TYPES,
    architectures,
    check_aux,
    check_context_cap,
    check_dflash_block,
    check_dflash_mask,
    check_hidden,
    check_mtp_rewrite,
    check_rope,
    check_special_ids,
    check_vocab,
    check_yarn_factor,
    diagnose_mtp,
    effective_aux_layer_ids,
    infer_method,
    mtp_experts_quantized,
    rope_type,
    text_config,
    text_field,
    uses_aux,
)
from .codes import ERROR, WARNING, finding
from .config_fields import validated_config
from .draft_kinds import (
    DFLASH_ARCHITECTURES,
    DRAFT_ONLY_KEYS,
    EAGLE3_ARCHITECTURES,
    is_draft_architecture,
    resolved_architecture,
)

__all__ = [
    "CACHE_ONLY_ROPE_TYPES",
    "METHODS",
    "DoctorReport",
    "diagnose",
    "diagnose_configs",
    "effective_aux_layer_ids",
    "infer_method",
    "mtp_experts_quantized",
]

#: The methods the doctor checks (``--method``).
METHODS = ("eagle3", "dflash", "mtp", "draft_model")


@dataclasses.dataclass
class DoctorReport:
    target: str
    draft: str
    method: str | None
    findings: list[Finding]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def unreadable(self) -> bool:
        """A config could not be read at all: no verdict (exit 2)."""
        return any(f.code == "E-CONFIG" for f in self.findings)

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "draft": self.draft, "method": self.method,
                "ok": self.ok, "findings": [f.to_dict() for f in self.findings]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format_text(self) -> str:
        head = (f"draft {self.draft} for target {self.target} "
                f"(method {self.method or 'auto'}): ")
        if not self.findings:
            return head + "no findings"
        head += f"{len(self.errors)} error(s), {len(self.warnings)} warning(s)"
        return "\n".join([head, *(f"  {f}" for f in self.findings)])


# --------------------------------------------------------------------------- #
# Which checkpoint is which                                                    #
# --------------------------------------------------------------------------- #


def _looks_like_draft(cfg: dict) -> list[str]:
    """Why ``cfg`` is a draft's config (empty: it is not)."""
    why = [f"architecture {a!r}" for a in architectures(cfg) if is_draft_architecture(a)]
    why += [f"draft-only key {k!r}" for k in DRAFT_ONLY_KEYS if k in cfg]
    return why


def _same_model(t: dict, d: dict) -> bool:
    keys = ("hidden_size", "num_hidden_layers", "vocab_size")
    return (bool(architectures(t)) and architectures(t) == architectures(d)
            and all(text_field(t, k) == text_field(d, k) for k in keys))


def _check_roles(t: dict, d: dict, method: str | None, *, same_dir: bool,
                 files: tuple[str, str]) -> list[Finding]:
    """Target passed as draft, arguments swapped, method unknown."""
    out: list[Finding] = []
    t_file, d_file = files
    why = _looks_like_draft(t)
    if why:
        out.append(finding("E-TARGET-IS-DRAFT", (
            f"the --target checkpoint ({t_file}) is a draft, not a target model "
            f"({', '.join(why[:2])}): were --target and --draft swapped?"), file=t_file))
    if method != "mtp" and (same_dir or _same_model(t, d)):
        how = "the same directory" if same_dir else (
            f"same architecture {architectures(d)} and sizes")
        out.append(finding("E-DRAFT-IS-TARGET", (
            f"the draft ({d_file}) is the target checkpoint itself ({how}): method "
            f"{method or 'auto'} needs a separate draft; only method 'mtp' runs from the "
            "target's own directory."), file=d_file))
    if method is None:
        out.append(finding("E-METHOD-UNKNOWN", (
            f"cannot tell the speculative method from the draft (architectures "
            f"{architectures(d) or 'absent'}): pass --method eagle3, dflash, mtp or "
            "draft_model so the method's checks run."), file=d_file, field="architectures"))
    return out


def _check_draft_kind(d: dict, tensors: TensorIndex, method: str | None, *,
                      tensors_complete: bool, d_file: str) -> list[Finding]:
    """What the method needs the draft to be (see :mod:`.draft_kinds`)."""
    archs = architectures(d)
    out: list[Finding] = []
    known = {"eagle3": EAGLE3_ARCHITECTURES, "dflash": DFLASH_ARCHITECTURES}.get(method or "")
    if known is not None and archs:
        resolved = [resolved_architecture(a, method) for a in archs]
        if not any(r in known for r in resolved):
            out.append(finding("E-DRAFT-ARCH", (
                f"draft architectures {archs} are not a draft for method {method}: vLLM "
                f"0.34.0 would look for {resolved}, which it does not have ({method} classes: "
                f"{', '.join(sorted(known))})."), file=d_file, field="architectures"))
    if method == "draft_model" and archs:
        head = [a for a in archs if is_draft_architecture(a)
                or not a.endswith(("ForCausalLM", "ForConditionalGeneration"))]
        if head or tensors.find("fc.weight") is not None:
            what = f"architectures {archs}" + (" and an fc weight"
                                               if tensors.find("fc.weight") else "")
            out.append(finding("E-DRAFT-ARCH", (
                f"method draft_model needs an ordinary causal LM (*ForCausalLM), but the "
                f"draft has {what}: it is a draft head; use its own method."),
                file=d_file, field="architectures"))
    if method in ("eagle3", "dflash") and tensors_complete and tensors.find("fc.weight") is None:
        out.append(finding("E-DRAFT-NO-FC", (
            f"the draft has no fc weight (the layer that fuses the target's hidden states "
            f"into the draft): it is not a draft for method {method}."), field="fc.weight"))
    return out


# --------------------------------------------------------------------------- #
# Fields the checks need                                                       #
# --------------------------------------------------------------------------- #

_TARGET_NEEDS = {
    "vocab_size": "the draft's vocabulary, d2t/t2d maps and special/mask ids",
    "hidden_size": "the hidden size the draft expects and its fc width",
    "num_hidden_layers": "the aux layer ids the draft taps",
    "max_position_embeddings": "whether the draft caps the served context "
                               "(or pass --max-model-len)",
}
_DRAFT_NEEDS = {
    "architectures": "which class vLLM builds for the draft",
    "vocab_size": "the draft's vocabulary against the target's",
    "hidden_size": "the draft's hidden size against the target's",
    "num_hidden_layers": "how many layers vLLM builds",
    "max_position_embeddings": "the context the draft allows (transformers would fill in "
                               "its model type's default, which may cap the served context)",
}
_NEEDED = {  # method: (target fields, draft fields)
    "eagle3": (tuple(_TARGET_NEEDS), ("architectures", "vocab_size", "hidden_size",
                                      "max_position_embeddings")),
    "dflash": (tuple(_TARGET_NEEDS), tuple(_DRAFT_NEEDS)),
    "draft_model": (("vocab_size", "hidden_size", "max_position_embeddings"),
                    tuple(_DRAFT_NEEDS)),
    "mtp": (("vocab_size", "hidden_size"), ("vocab_size", "hidden_size")),
    None: (("vocab_size", "hidden_size"), ("architectures",)),
}


def _check_needed(t: dict, d: dict, method: str | None, *, served: int | None,
                  invalid: set[tuple[str, str]], files: tuple[str, str]) -> list[Finding]:
    """``E-CONFIG-MISSING`` for each field a check needs and the config lacks (fields
    already reported as ill-typed are not reported again)."""
    t_need, d_need = _NEEDED.get(method, _NEEDED[None])
    out: list[Finding] = []
    for role, cfg, need, meaning, file in (("target", t, t_need, _TARGET_NEEDS, files[0]),
                                           ("draft", d, d_need, _DRAFT_NEEDS, files[1])):
        for name in need:
            if name == "max_position_embeddings" and (
                    served if role == "target" else rope_type(cfg) in CACHE_ONLY_ROPE_TYPES):
                continue  # given on the command line / vLLM raises a cache-only limit
            if (role, name) in invalid or text_field(cfg, name) is not None:
                continue
            where = " (top level or text_config)" if "text_config" in cfg else ""
            out.append(finding("E-CONFIG-MISSING", (
                f"{role} {file} has no {name}{where}: cannot check {meaning[name]}."),
                file=file, field=name))
    return out


# --------------------------------------------------------------------------- #
# Orchestration                                                                #
# --------------------------------------------------------------------------- #

_WEIGHT_CODES = {"missing": "E-WEIGHTS-MISSING", "index": "E-WEIGHTS-INDEX",
                 "header": "E-WEIGHTS-HEADER", "size": "E-WEIGHTS-SIZE"}


def _weight_findings(problems: Sequence[WeightProblem]) -> list[Finding]:
    return [finding(_WEIGHT_CODES[p.kind], p.message + (
        " The checks that read tensors cannot run on it." if p.kind in ("missing", "header")
        else ""), file=p.file) for p in problems]


def _non_finite_findings(tensors: TensorIndex) -> list[Finding]:
    """One finding naming the draft's float tensors that hold NaN or infinities."""
    bad = []
    for name in sorted(tensors.names()):
        try:
            at = tensors.first_non_finite(name)
        except (OSError, ValueError):  # a short file: already E-WEIGHTS-SIZE
            continue
        if at is not None:
            bad.append((name, at))
    if not bad:
        return []
    name, at = bad[0]
    more = ""
    if len(bad) > 1:
        more = f"; {len(bad)} tensors in all: {', '.join(n for n, _ in bad[:6])}" + (
            ", ..." if len(bad) > 6 else "")
    return [finding("E-WEIGHTS-NONFINITE",
                    f"{tensors.file(name)}: tensor {name} holds NaN or infinite values (first "
                    f"at element {at}){more}; re-export or retrain the draft",
                    file=tensors.file(name), field=name)]


def diagnose_configs(
    target_cfg: dict,
    draft_cfg: dict,
    tensors: TensorIndex,
    *,
    method: str | None = None,
    served_max_model_len: int | None = None,
    draft_name: str = "draft",
    vllm_keeps_eagle3_deepseek_heads: bool | None = None,
    draft_is_target_dir: bool = False,
    tensors_complete: bool = True,
    files: tuple[str, str] = ("target config.json", "draft config.json"),
) -> list[Finding]:
    """All findings for a (target config, draft config, draft tensors) triple.

    ``tensors_complete=False`` (some weight file unreadable, already reported) skips
    the checks that would report a tensor as absent. ``files`` name the two configs
    in messages."""
    t, t_problems = validated_config(target_cfg)
    d, d_problems = validated_config(draft_cfg)
    out = [finding("E-CONFIG-TYPE", f"{role} {file}: {p.describe()}.", file=file,
                   field=p.field)
           for role, file, problems in (("target", files[0], t_problems),
                                        ("draft", files[1], d_problems)) for p in problems]
    invalid = {(role, p.field.removeprefix("text_config."))
               for role, problems in (("target", t_problems), ("draft", d_problems))
               for p in problems}
    method = method or infer_method(d, Path(draft_name).name)
    out += _check_roles(t, d, method, same_dir=draft_is_target_dir, files=files)
    out += _check_draft_kind(d, tensors, method, tensors_complete=tensors_complete,
                             d_file=files[1])
    out += _check_needed(t, d, method, served=served_max_model_len, invalid=invalid,
                         files=files)
    if method == "mtp":
        return out + diagnose_mtp(t, d, tensors, tensors_complete=tensors_complete)
    tgt = text_config(t)
    t_vocab = int(tgt.get("vocab_size") or t.get("vocab_size") or 0)
    t_hidden = int(tgt.get("hidden_size") or 0)
    t_layers = int(tgt.get("num_hidden_layers") or 0)
    if method == "eagle3":
        out += check_mtp_rewrite(d, vllm_keeps_eagle3_deepseek_heads)
    out += check_context_cap(tgt, d, served_max_model_len)
    if method in ("eagle3", "dflash") and uses_aux(d):
        out += check_aux(d, tensors, method, t_hidden, t_layers)
    out += check_vocab(d, tensors, t_vocab, tensors_complete=tensors_complete)
    out += check_hidden(d, t_hidden)
    out += check_rope(tgt, d)
    out += check_yarn_factor(d, method)
    out += check_special_ids(d, t_vocab)
    if method == "dflash":
        out += check_dflash_mask(d, t_vocab)
        out += check_dflash_block(d)
    return out


def _load_config(path: Path, what: str) -> dict:
    """A config.json as a dict; raises ``ValueError`` / ``OSError`` naming the file."""
    file = path / "config.json" if path.is_dir() else path
    if not path.exists():
        raise FileNotFoundError(f"{what}: no config.json at {file} ({path} does not exist)")
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{what}: no config.json at {file}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what}: {file} is not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise OSError(f"{what}: cannot read {file} ({exc.strerror or exc})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what}: {file} is not valid JSON ({exc})") from exc
    if not isinstance(cfg, dict):
        raise ValueError(f"{what}: {file} holds a JSON {type(cfg).__name__}, expected an "
                         "object of config fields")
    return cfg


def diagnose(
    target: str | Path,
    draft: str | Path,
    *,
    method: str | None = None,
    served_max_model_len: int | None = None,
    vllm_keeps_eagle3_deepseek_heads: bool | None = None,
) -> DoctorReport:
    """Check draft directory ``draft`` against target directory ``target``.

    ``method`` is the speculative method (``eagle3``, ``dflash``, ``mtp``,
    ``draft_model``; detected from the draft when omitted). For ``mtp`` the draft may
    be the target itself. ``served_max_model_len`` defaults to the target's
    ``max_position_embeddings``. A config that cannot be read gives a report with
    one ``E-CONFIG`` finding (:attr:`DoctorReport.unreadable`).
    """
    target, draft = Path(target), Path(draft)
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if served_max_model_len is not None and served_max_model_len <= 0:
        raise ValueError(f"served_max_model_len must be positive, got {served_max_model_len}")
    try:
        t_cfg = _load_config(target, "target")
        d_cfg = _load_config(draft, "draft")
    except (OSError, ValueError) as exc:
        return DoctorReport(str(target), str(draft), method,
                            [finding("E-CONFIG", str(exc))])
    draft_dir = draft if draft.is_dir() else draft.parent
    tensors, problems = scan_weights(draft_dir)
    target_dir = target if target.is_dir() else target.parent
    same_dir = target_dir.resolve() == draft_dir.resolve()
    method = method or infer_method(validated_config(d_cfg)[0], draft_dir.name)
    files = (str(target_dir / "config.json") if target.is_dir() else str(target),
             str(draft_dir / "config.json") if draft.is_dir() else str(draft))
    complete = not any(p.kind in ("missing", "header", "size") for p in problems)
    findings = _weight_findings(problems) + (
        _non_finite_findings(tensors) if complete and not same_dir else []) + diagnose_configs(
        t_cfg, d_cfg, tensors, method=method, served_max_model_len=served_max_model_len,
        draft_name=draft_dir.name,
        vllm_keeps_eagle3_deepseek_heads=vllm_keeps_eagle3_deepseek_heads,
        draft_is_target_dir=same_dir,
        tensors_complete=not any(p.kind in ("missing", "header") for p in problems),
        files=files)
    return DoctorReport(str(target), str(draft), method, findings)


def raise_on_errors(report: DoctorReport, logger=None, *, context: Sequence[str] = ()) -> None:
    """Log warnings; raise ``ValueError`` listing every error."""
    if logger is not None:
        for f in report.warnings:
            logger.warning("vllm-kimi-ext draft check: %s", f)
    if report.errors:
        lines = [f"draft {report.draft} is not usable with target {report.target} "
                 f"(method {report.method}):", *context,
                 *(f"  {f}" for f in report.errors)]
        raise ValueError("\n".join(lines))

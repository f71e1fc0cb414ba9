"""vLLM general plugin entry point (``vllm.general_plugins``: ``kimi_ext``).

vLLM calls :func:`register` in every process it starts (API server, engine
core, each worker), possibly more than once per process, so it is re-entrant:
runtime patches are applied once and a second call only re-checks.

Nothing happens unless ``VLLM_KIMI_EXT=1``: installing the package must not
change vLLM's behaviour. When enabled, the plugin

1. parses every ``VLLM_KIMI_EXT_*`` variable (:mod:`vllm_kimi_ext.envs`; an
   invalid value stops the process with one line naming it, exit 2; a set
   ``VLLM_KIMI_EXT*`` name it does not know is named in a warning with the closest
   known name, enabled or not);
2. checks the pin (:mod:`vllm_kimi_ext.compat`) and refuses — raising, which
   stops vLLM before anything is served — on a vLLM other than 0.34.0 or a tree
   whose applied patch series differs from this package's;
3. registers its variables with vLLM, so vLLM does not warn about them as
   unknown (:func:`register_env_vars`);
4. registers ``method: "kimi_tli"`` (:mod:`vllm_kimi_ext.integration.tli_config`),
   applies the runtime patches the flags ask for
   (:func:`vllm_kimi_ext.runtime.apply_all`) and logs one line per process:
   package version, applied patch series, runtime patches installed.

The variables and their meaning: :mod:`vllm_kimi_ext.envs` (README's table).
"""

from __future__ import annotations

import logging
import os
import sys

from vllm_kimi_ext import __version__, envs

logger = logging.getLogger("vllm_kimi_ext")

_state: dict[str, object] = {"registered": False}
#: exit status of a process stopped by an invalid variable (the CLIs' "usage" code)
EXIT_BAD_ENV = 2


def enabled() -> bool:
    return envs.ENABLE.get()


def register_speculative_methods() -> list[str]:
    """Register this project's speculative methods with vLLM's custom-speculator
    API (re-entrant: vLLM accepts the same registration twice)."""
    from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

    from vllm_kimi_ext.integration.tli_config import TLI_METHOD

    register_speculative_method(
        TLI_METHOD, "vllm_kimi_ext.integration.tli_config.TLISpeculatorConfig")
    return [TLI_METHOD]


def register_env_vars() -> list[str]:
    """Add this package's variables to ``vllm.envs.environment_variables``.

    vLLM 0.34.0 warns about every set ``VLLM_*`` variable missing from that
    table ("Unknown vLLM environment variable detected", or refuses to start
    with ``fail_on_environ_validation``: ``Platform.validate_environ``, called
    while ``EngineArgs`` builds the config, after the general plugins ran). The
    table is vLLM's registry of variables; out-of-tree plugins add theirs to it.
    The getters parse at call time, like :mod:`vllm_kimi_ext.envs`. vLLM hashes
    every registered variable into its ``torch.compile`` cache key
    (``vllm.envs.compile_factors``), so changing one of ours compiles afresh
    instead of reusing a graph compiled under other runtime patches.
    Returns the names added now."""
    import vllm.envs as vllm_envs

    added = []
    for flag in envs.FLAGS:
        if flag.name not in vllm_envs.environment_variables:
            vllm_envs.environment_variables[flag.name] = flag.get
            added.append(flag.name)
    return added


class _ThroughVllmLogger(logging.Handler):
    """Hands each record to vLLM's ``vllm`` logger, i.e. to whatever handlers,
    level and format vLLM's logging configuration gives it at that moment."""

    def emit(self, record: logging.LogRecord) -> None:
        target = logging.getLogger("vllm")
        if target.isEnabledFor(record.levelno):
            target.handle(record)


def _route_logs_through_vllm() -> None:
    """vLLM's logging configuration gives handlers to its own ``vllm`` logger
    only, so in a server this package's INFO lines would be dropped. When no root
    handler exists (nobody else would show them), route the ``vllm_kimi_ext``
    logger's records through vLLM's logger: they appear in vLLM's log, in vLLM's
    format, filtered by ``VLLM_LOGGING_LEVEL`` (once per process)."""
    ours = logging.getLogger("vllm_kimi_ext")
    if logging.getLogger().handlers or any(
            isinstance(h, _ThroughVllmLogger) for h in ours.handlers):
        return
    ours.addHandler(_ThroughVllmLogger())
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.DEBUG)  # vLLM's logger decides what is shown


def status_line(methods: list[str]) -> str:
    """The one line the plugin logs per process once active."""
    from vllm_kimi_ext import compat
    from vllm_kimi_ext.patching import applied_patches

    record = compat.applied_record()
    if record is None:
        series = "no applied patch series recorded"
    else:
        names = [e["name"] for e in record.get("series", [])]
        span = f"{names[0].split('-')[0]}-{names[-1].split('-')[0]}" if names else "empty"
        series = f"patch series {span} ({len(names)} patches, digest {record['digest'][:12]})"
    patches = ", ".join(sorted(applied_patches())) or "none"
    return (f"vllm-kimi-ext {__version__} active (pid {os.getpid()}): "
            f"vLLM {compat.installed_vllm_version()}, {series}; "
            f"runtime patches: {patches}; speculative methods: {', '.join(methods)}")


def check_environment() -> bool:
    """Warn about unknown ``VLLM_KIMI_EXT*`` names and settings without effect (a flag set
    while one it needs is off); parse every flag. Returns whether
    the plugin is enabled. An invalid value prints one line naming the variable and
    what was expected and raises ``SystemExit(2)``: vLLM calls the plugin outside any handler of
    its own, so anything else would reach a ``vllm serve`` user as a traceback."""
    try:
        on = enabled()
        if on:
            envs.check_all()
    except envs.EnvError as exc:
        print(f"vllm-kimi-ext: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_BAD_ENV) from None
    warnings = envs.startup_warnings()
    if warnings:
        _route_logs_through_vllm()
        for line in warnings:
            logger.warning("vllm-kimi-ext: %s", line)
    return on


def register() -> None:
    """Entry point vLLM calls; see the module docstring."""
    if not check_environment():
        logger.debug("vllm-kimi-ext installed but inactive (set %s=1)", envs.ENABLE.name)
        return
    _route_logs_through_vllm()
    from vllm_kimi_ext.compat import check_compat

    overridden = check_compat()
    for problem in overridden:
        logger.warning("vllm-kimi-ext: continuing despite: %s", problem)
    if _state["registered"]:
        return
    from vllm_kimi_ext import runtime

    register_env_vars()
    methods = register_speculative_methods()
    runtime.apply_all()
    _state["registered"] = True
    logger.info(status_line(methods))

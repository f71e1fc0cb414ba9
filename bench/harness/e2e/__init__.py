"""End-to-end serving benchmark: ``vllm serve`` over a config matrix, a bounded load
generator against the OpenAI-compatible API on localhost, metric scraping and ``compare``.

The CLI is ``bench/e2e/runner.py``; this package holds the logic so tests can import it:

- :mod:`.config`: the config file (format in its docstring) and its checks;
- :mod:`.matrix`: the server launches a config expands to, and their pythons;
- :mod:`.checkpoint`: the ``@tiny`` model written on the fly;
- :mod:`.metrics`: vLLM's Prometheus counters and the plugin's collective log lines;
- :mod:`.load`: the HTTP load generator (streamed chat completions, TTFT / TPOT);
- :mod:`.server`: one ``vllm serve`` process (software probe, readiness, shutdown);
- :mod:`.run`: the matrix run and its ``results.json`` / ``report.md``;
- :mod:`.report`: the markdown report and ``compare``.
"""

from bench.harness.e2e.checkpoint import tiny_asset_paths, write_tiny_assets
from bench.harness.e2e.config import (
    DEFAULT_CONFIG,
    TINY,
    TINY_EAGLE3,
    ConfigError,
    load_config,
    normalize_config,
    python_refs,
)
from bench.harness.e2e.load import http_get, one_request, run_level
from bench.harness.e2e.matrix import (
    ServerConfig,
    check_python_names,
    check_pythons,
    expand_matrix,
    level_plan,
    parse_pythons,
    parse_select,
    python_path,
    serve_command,
)
from bench.harness.e2e.metrics import (
    acceptance_delta,
    metric_total,
    parse_collective_lines,
    parse_prometheus,
)
from bench.harness.e2e.report import compare_markdown, compare_rows, e2e_markdown, plan_markdown
from bench.harness.e2e.run import (
    RESULT_NAMES,
    Plan,
    clear_earlier_results,
    earlier_results,
    plan_matrix,
    run_matrix,
)
from bench.harness.e2e.server import Server, probe_software, served_model_id

__all__ = [
    "DEFAULT_CONFIG",
    "RESULT_NAMES",
    "TINY",
    "TINY_EAGLE3",
    "ConfigError",
    "Plan",
    "Server",
    "ServerConfig",
    "acceptance_delta",
    "check_python_names",
    "check_pythons",
    "clear_earlier_results",
    "compare_markdown",
    "compare_rows",
    "e2e_markdown",
    "earlier_results",
    "expand_matrix",
    "http_get",
    "level_plan",
    "load_config",
    "metric_total",
    "normalize_config",
    "one_request",
    "parse_collective_lines",
    "parse_prometheus",
    "parse_pythons",
    "parse_select",
    "plan_markdown",
    "plan_matrix",
    "probe_software",
    "python_path",
    "python_refs",
    "run_level",
    "run_matrix",
    "serve_command",
    "served_model_id",
    "tiny_asset_paths",
    "write_tiny_assets",
]

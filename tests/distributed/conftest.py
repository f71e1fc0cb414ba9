"""The gloo TP=2 scenarios of this tier run in ONE spawned rank set per session
(``tp2_rank_set``): starting two ranks costs a vLLM import and a process start each
(~20-40 s on 2 cores), which every file paid on its own before. Each test file gets
its scenario's per-rank results from a fixture below (``tp2_target_results``,
``draft_tp_results``, ``tli_tp2_results``, ``tli_placement_tp2_results``), exactly what
its own ``run_tp`` call returned."""

import pytest

#: Rows per draft pass of the EAGLE-3 cases in ``draft_tp_results``.
DRAFT_TP_ROWS = 2
#: Rows of the target pass in ``tp2_target_results``.
TARGET_ROWS = 4
#: Rows of the ``kimi_tli`` draft steps (``tli_tp2_results``, ``tli_placement_tp2_results``).
TLI_ROWS = 4
#: A rank set runs every scenario below; the per-file timeout of ``run_tp`` was 600 s.
RANK_SET_TIMEOUT = 1800.0


@pytest.fixture(scope="session")
def eagle3_heads(tmp_path_factory):
    """Tiny EAGLE-3 heads for the tiny Kimi-K2.5 target: name -> (directory,
    checkpoint shapes). ``llama-shared`` has no embedding of its own; ``llama-v512``
    has a reduced draft vocabulary (512)."""
    from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3

    root = tmp_path_factory.mktemp("heads")
    specs = {"llama": TinyEagle3Spec(style="llama"),
             "mla": TinyEagle3Spec(style="mla"),
             "llama-shared": TinyEagle3Spec(style="llama", share_embedding=True),
             "llama-v512": TinyEagle3Spec(style="llama", draft_vocab_size=512)}
    return {name: (str(root / name), write_tiny_eagle3(root / name, TinyKimiSpec(), spec))
            for name, spec in specs.items()}


@pytest.fixture(scope="session")
def dflash_draft(tmp_path_factory):
    """A tiny DFlash drafter (two Qwen3-style layers) for the tiny Kimi-K2.5 target."""
    from testkit.checkpoints import TinyKimiSpec
    from testkit.draft_scenarios import TinyDFlashSpec, write_tiny_dflash

    path = tmp_path_factory.mktemp("drafts") / "dflash"
    write_tiny_dflash(path, TinyKimiSpec(), TinyDFlashSpec())
    return str(path)


def draft_cases(eagle3_heads, dflash_draft):
    """The draft cases of ``draft_tp_results``: sharded EAGLE-3 heads (Llama-style, MLA,
    reduced vocabulary) and a DFlash drafter (test_draft_collectives.py); ``llama-tp1``
    in any vLLM (stock: the value is accepted and ignored); with patch 0006 the other
    draft-TP-1 (``*-tp1``) heads, and the replicated-embedding (``*-repl``, runtime patch
    R08) heads, last as before."""
    from testkit.draft_scenarios import (
        DraftCase,
        TinyDFlashSpec,
        has_replicated_embedding_patch,
        has_unsharded_draft_patch,
    )

    def eagle3(head, suffix="", options=()):
        return DraftCase(f"{head}{suffix}", "eagle3", eagle3_heads[head][0],
                         rows=DRAFT_TP_ROWS, options=options)

    tp1 = (("draft_tensor_parallel_size", 1),)
    cases = [eagle3("llama"), eagle3("mla"), eagle3("llama-v512"),
             DraftCase("dflash", "dflash", dflash_draft, rows=TinyDFlashSpec().block_size),
             eagle3("llama", "-tp1", tp1)]
    if has_unsharded_draft_patch():
        cases += [eagle3("mla", "-tp1", tp1), eagle3("llama-shared", "-tp1", tp1)]
    if has_replicated_embedding_patch():
        cases += [eagle3(head, "-repl", (("replicate_draft_embedding", True),))
                  for head in ("llama", "mla", "llama-shared")]
    return cases


@pytest.fixture(scope="session")
def tli_target(tmp_path_factory):
    """A tiny Kimi-K2.5 checkpoint with its Kimi-format tokenizer files."""
    from testkit.tli_scenarios import write_tli_target

    return write_tli_target(tmp_path_factory.mktemp("tli-target"))


@pytest.fixture(scope="session")
def tli_retokenized_draft(tli_target, tmp_path_factory):
    """The target's own language model re-indexed for another tokenizer."""
    from testkit.tli_scenarios import write_retokenized_draft

    return write_retokenized_draft(tli_target, tmp_path_factory.mktemp("tli-draft"))


@pytest.fixture(scope="session")
def tli_qwen3_draft(tli_target, tmp_path_factory):
    """A tiny dense Qwen3 draft with a byte-level tokenizer of another family."""
    from testkit.tli_scenarios import write_tiny_qwen3_draft

    return write_tiny_qwen3_draft(tli_target, tmp_path_factory.mktemp("qwen3-draft"))


@pytest.fixture(scope="session")
def tp2_rank_set(tiny_kimi_dir, eagle3_heads, dflash_draft, tli_target,
                 tli_retokenized_draft, tli_qwen3_draft):
    """One TP=2 rank set running every scenario of this tier's TP=2 fixtures in order;
    per rank a dict scenario name -> that scenario's result. The draft scenarios run
    last: their size-1 group check tears the model-parallel groups down."""
    from testkit.distributed import run_in_sequence, run_tp
    from testkit.draft_scenarios import unsharded_draft_scenarios
    from testkit.tli_scenarios import tli_draft_collectives, tli_placement_collectives
    from testkit.tp_scenarios import target_pass_collectives

    scenarios = [
        ("target", target_pass_collectives, (str(tiny_kimi_dir), TARGET_ROWS)),
        ("tli", tli_draft_collectives,
         (str(tli_target), str(tli_retokenized_draft.path), TLI_ROWS)),
        ("tli_placement", tli_placement_collectives,
         (str(tli_target), str(tli_qwen3_draft.path), TLI_ROWS)),
        ("drafts", unsharded_draft_scenarios,
         (str(tiny_kimi_dir), draft_cases(eagle3_heads, dflash_draft))),
    ]
    return run_tp(run_in_sequence, 2, scenarios, timeout=RANK_SET_TIMEOUT)


def _scenario(rank_set, name):
    return [rank[name] for rank in rank_set]


@pytest.fixture(scope="session")
def tp2_target_results(tp2_rank_set):
    """The tiny Kimi-K2.5 target at TP=2 (``target_pass_collectives``, 4 rows):
    collectives of one pass, local logits (patch 0002), sharded verification."""
    return _scenario(tp2_rank_set, "target")


@pytest.fixture(scope="session")
def draft_tp_results(tp2_rank_set):
    """Tiny drafts on the tiny Kimi-K2.5 target under vLLM's real ``load_eagle_model``
    (``unsharded_draft_scenarios`` over :func:`draft_cases`), plus the agreement check
    (``_agreement``) and, with patch 0006, the size-1 group check (``_tp_group``)."""
    return _scenario(tp2_rank_set, "drafts")


@pytest.fixture(scope="session")
def tli_tp2_results(tp2_rank_set):
    """One ``kimi_tli`` draft step next to the plain draft step
    (``tli_draft_collectives`` with the re-indexed draft)."""
    return _scenario(tp2_rank_set, "tli")


@pytest.fixture(scope="session")
def tli_placement_tp2_results(tp2_rank_set):
    """A dense Qwen3 draft through ``kimi_tli``: sharded, draft TP 1, and draft TP 1 with
    probabilistic drafting (``tli_placement_collectives``)."""
    return _scenario(tp2_rank_set, "tli_placement")

"""Edge cases of three checks, each at the boundary an off-by-one or a too-weak
comparison would miss: the tokenizer comparison's last shared rank,
``apply-patches`` on a tree whose patched file was amended into the series' last
commit, and the cost model's verification bytes against the verifier's own
communication plan."""

from __future__ import annotations

import pytest

from testkit.tokenizers import build_ranks, write_kimi_tokenizer, write_rank_file
from tests.unit.test_patchset import _git, _make_patches, fake_vllm  # noqa: F401 (fixture)
from vllm_kimi_ext import patchset
from vllm_kimi_ext.tokenizers import check_tokenizers

N = 1024  # ranks of the small test tokenizers


# ------------------------------------------------------------------ tokenizers


@pytest.mark.parametrize("draft_ranks", [N, N + 8], ids=["same-size", "draft-longer"])
def test_a_draft_whose_last_shared_rank_differs_is_incompatible(tmp_path, draft_ranks):
    target = write_kimi_tokenizer(tmp_path / "target", n_ranks=N)
    draft = write_kimi_tokenizer(tmp_path / "draft", n_ranks=draft_ranks)
    ranks = build_ranks(draft_ranks)
    assert b"\x00planted" not in ranks
    ranks[N - 1] = b"\x00planted"  # the target's last rank, which the draft shares
    write_rank_file(draft / "tiktoken.model", ranks)
    report = check_tokenizers(target, draft)
    assert report.verdict == "incompatible", report.format_text()
    assert "rank_mismatch" in report.codes("incompatible")
    assert report.first_rank_mismatch["rank"] == N - 1
    assert report.first_rank_mismatch["differing_ranks"] == 1


def test_a_draft_whose_first_rank_differs_is_incompatible(tmp_path):
    target = write_kimi_tokenizer(tmp_path / "target", n_ranks=N)
    draft = write_kimi_tokenizer(tmp_path / "draft", n_ranks=N)
    ranks = build_ranks(N)
    ranks[0] = b"\x00planted"
    write_rank_file(draft / "tiktoken.model", ranks)
    report = check_tokenizers(target, draft)
    assert report.verdict == "incompatible" and report.first_rank_mismatch["rank"] == 0


# ------------------------------------------------------------------ apply-patches


@pytest.fixture()
def applied(fake_vllm, tmp_path):  # noqa: F811 (the imported fixture)
    """The small vLLM-shaped repo of the patchset tests with a two-patch series
    applied: ``(tree, patch_dir)``."""
    pdir = tmp_path / "patches"
    _make_patches(fake_vllm, pdir, [("[A] one", "line_3 = 3", "line_3 = 33"),
                                    ("[B] two", "line_30 = 30", "line_30 = 300")])
    assert patchset.apply_series(fake_vllm, pdir).changed
    return fake_vllm, pdir


def test_an_amended_patched_file_is_not_already_applied(applied):
    """A local edit to a patched file, amended into the series' last commit: the
    branch is still baseline + one commit per patch and the tree is clean, only the
    file differs from what the series writes."""
    tree, pdir = applied
    entries = patchset.read_series(pdir)
    assert patchset.tree_is_applied(tree, entries)
    cfg = tree / "vllm" / "config.py"
    patched = cfg.read_text()
    cfg.write_text(patched.replace("line_20 = 20", "line_20 = 'local'"))
    _git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    assert _git(tree, "rev-list", "--count", f"{patchset.BASELINE_TAG}..HEAD") == "2"
    assert _git(tree, "status", "--porcelain", "--untracked-files=no") == ""
    assert not patchset.tree_is_applied(tree, entries)
    result = patchset.apply_series(tree, pdir)
    assert result.changed  # re-applied from the baseline, not "already applied"
    assert cfg.read_text() == patched
    assert patchset.tree_is_applied(tree, entries)


def test_a_file_amended_into_the_series_is_not_already_applied(applied):
    """The amend adds a file the series never touches: the set of touched files grows."""
    tree, pdir = applied
    entries = patchset.read_series(pdir)
    (tree / "vllm" / "extra.py").write_text("x = 1\n")
    _git(tree, "add", "vllm/extra.py")
    _git(tree, "commit", "-q", "--amend", "--no-edit")
    assert not patchset.tree_is_applied(tree, entries)
    assert patchset.apply_series(tree, pdir).changed
    assert not (tree / "vllm" / "extra.py").exists()


# ------------------------------------------------------------------ cost model


@pytest.fixture(scope="module")
def cm():
    from vllm_kimi_ext.costmodel import CostModel

    return CostModel.build("rtx-pro-6000-pcie-x8")


@pytest.mark.parametrize("rows", [1, 4, 64, 2048])
def test_verification_bytes_match_the_verifiers_own_plan(cm, rows):
    """Sharded: per row and rank what the step's plan (``verify.protocol``) sends for a
    sampling batch with one-hot drafts (4 float32), the all-gather's output TP times that.
    Gather: every rank receives ``[rows, vocab]`` bf16, i.e. 2 x V bytes per row."""
    from vllm_kimi_ext.verify import full_gather_bytes_per_row, plan_from_params

    tp, vocab = cm.tp, cm.model.vocab_size
    assert (tp, vocab) == (8, 163840)  # the Kimi-K2.5 profile on 8 GPUs
    plan = plan_from_params([{"temperature": 1.0}], tp_size=tp, vocab_size=vocab,
                            num_rows=rows, max_rows_per_req=rows)
    assert plan.bytes_per_row_per_rank == 4 * 4
    gathers = int(cm.model.collectives.get("logits_allgather", 1))
    sharded = cm.verification(rows, "sharded", "nccl")
    assert sum(t.comm_bytes_per_rank for t in sharded) == gathers * plan.bytes_sent_per_rank
    assert sum(t.comm_bytes for t in sharded) == gathers * plan.bytes_received_per_rank
    assert sum(t.comm_bytes for t in sharded) == gathers * rows * 16 * tp
    full = cm.verification(rows, "gather", "nccl")
    assert full_gather_bytes_per_row(vocab) == 2 * vocab
    assert sum(t.comm_bytes for t in full) == gathers * rows * 2 * vocab
    assert sum(t.comm_bytes_per_rank for t in full) == gathers * rows * 2 * vocab / tp
    # the saving the README quotes: 2 x V bytes vs 16 x TP bytes received per row
    assert (sum(t.comm_bytes for t in full) / sum(t.comm_bytes for t in sharded) ==
        pytest.approx(2 * vocab / (16 * tp)))

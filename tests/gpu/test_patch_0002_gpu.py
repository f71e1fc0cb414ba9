"""Patch 0002 on a GPU: ``compute_logits_local`` returns this rank's vocabulary shard of
``compute_logits``, in bf16 on CUDA, for DeepSeek-V2/V3 (Kimi-K2's text model), Kimi-K2.5
(delegating to it) and the EAGLE-3 DeepSeek head (``Eagle3DeepseekV2ForCausalLM``) with and
without a reduced draft vocabulary (``d2t``).

**Level.** The GPU machine these runs target has torch 2.11 and Triton but no vLLM (0.34.0
needs a newer torch) and none of its Python dependencies: importing
``vllm.model_executor.models.deepseek_v2`` on the Python-only CPU build loads pydantic,
msgspec, pyzmq, xgrammar, llguidance, cbor2 and a dozen more, and vLLM's Python tree alone
is 62 MB. So no model is built there. What runs is vLLM's own code from the patched source
tree (``.vllm_src/`` or ``build/vllm-0.34.0/``): ``LogitsProcessor`` (``logits_processor.py``
loaded under stub parents) and the models' ``compute_logits`` / ``compute_logits_local``
method bodies compiled from their classes in ``deepseek_v2.py``, ``deepseek_eagle3.py``,
``kimi_k25.py`` (and ``interfaces.py``'s ``LocalArgmaxMixin``), with the class hierarchy
kept, on a stub ``lm_head`` holding one rank's rows of a bf16 weight (vLLM's
``UnquantizedEmbeddingMethod.apply`` is ``F.linear`` on CUDA). The shard arithmetic is
vLLM's (``pad_vocab_size``, ``vocab_range_from_global_vocab_size``, compiled from
``vocab_parallel_embedding.py``). TP = 8 is simulated by slicing: rank r's ``lm_head`` holds
its rows, and the all-gather inside ``compute_logits`` returns every rank's output of vLLM's
own ``LogitsProcessor`` (with ``skip_gather=True``) on its rows. TP >= 2 with NCCL was not run.

**Contract for a d2t head** (an assumption the patch must meet; the inherited method returns
the *draft*-vocabulary shard without the remap, which this refuses): either rank r's
``compute_logits_local`` equals rank r's shard of the target-vocabulary logits that
``compute_logits`` returns, or the method refuses with an error naming the draft-to-target
map (``d2t`` / ``draft_id_to_target_id``) or the draft vocabulary.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    "logits_processor": "vllm/model_executor/layers/logits_processor.py",
    "vocab": "vllm/model_executor/layers/vocab_parallel_embedding.py",
    "deepseek_v2": "vllm/model_executor/models/deepseek_v2.py",
    "deepseek_eagle3": "vllm/model_executor/models/deepseek_eagle3.py",
    "kimi_k25": "vllm/model_executor/models/kimi_k25.py",
    "interfaces": "vllm/model_executor/models/interfaces.py",
}
TP = 8
METHODS = ("compute_logits", "compute_logits_local")
D2T_WORDS = ("d2t", "draft_id_to_target_id", "draft vocab")


def vllm_tree() -> Path | None:
    """The patched vLLM 0.34.0 source tree (``.vllm_src/`` on a GPU machine)."""
    return next((p for p in (ROOT / ".vllm_src", ROOT / "build" / "vllm-0.34.0")
                 if all((p / f).is_file() for f in SOURCES.values())), None)


# ---------------------------------------------------------------------------------------------
# vLLM's code, from source
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _vllm_stubs(stubs: dict[str, dict]):
    """``vllm.*`` modules replaced by ``stubs`` while loading; the previous ones (an
    installed vLLM's, or none) are put back afterwards."""
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    for k in saved:
        del sys.modules[k]
    try:
        for name, attrs in stubs.items():
            m = types.ModuleType(name)
            m.__dict__.update(attrs)
            sys.modules[name] = m
        yield
    finally:
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
        sys.modules.update(saved)


class _PluggableLayer(nn.Module):
    """Stands in for ``vllm.model_executor.custom_op.PluggableLayer`` (an ``nn.Module``
    with an out-of-tree registry; the registry is not exercised here)."""

    @classmethod
    def register(cls, name):
        return lambda op_cls: op_cls


class _Platform:
    def use_all_gather(self) -> bool:  # CUDA: LogitsProcessor all-gathers
        return True

    def is_cuda(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False


def _no_collective(*a, **k):
    raise AssertionError("a collective was issued outside compute_logits (compute_logits_local "
                         "must return this rank's shard without one)")


def load_logits_processor(tree: Path) -> types.ModuleType:
    path = tree / SOURCES["logits_processor"]
    stubs = {
        "vllm.config": {"get_current_vllm_config":
                        lambda: types.SimpleNamespace(model_config=None)},
        "vllm.distributed": {"tensor_model_parallel_all_gather": _no_collective,
                             "tensor_model_parallel_gather": _no_collective},
        "vllm.logger": {"init_logger": lambda name: __import__("logging").getLogger(name)},
        "vllm.model_executor.custom_op": {"PluggableLayer": _PluggableLayer},
        "vllm.model_executor.layers.linear": {"UnquantizedLinearMethod": type("U", (), {})},
        "vllm.model_executor.layers.vocab_parallel_embedding": {
            "UnquantizedEmbeddingMethod": type("E", (), {}),
            "VocabParallelEmbedding": nn.Module},
        "vllm.platforms": {"current_platform": _Platform()},
        "vllm.utils.flashinfer": {"has_flashinfer": lambda: False},
    }
    with _vllm_stubs(stubs):
        spec = importlib.util.spec_from_file_location("_vllm_0002_logits_processor", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


def _class_node(tree: Path, key: str, name: str) -> ast.ClassDef:
    src = (tree / SOURCES[key]).read_text()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"{SOURCES[key]}: class {name} not found")


def _strip_annotations(fn: ast.FunctionDef) -> ast.FunctionDef:
    fn.returns = None
    for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs:
        a.annotation = None
    return fn


def compile_class(tree: Path, key: str, name: str, bases: dict[str, type],
                  default_base: type | None = None) -> type:
    """A stand-in for vLLM's class ``name`` holding exactly its ``compute_logits*`` methods
    (compiled from the source, line numbers kept, so ``super()`` and tracebacks work).
    ``bases`` maps the class's base names to stand-ins (a base not in it is an error,
    unless ``default_base`` replaces all of them)."""
    node = _class_node(tree, key, name)
    base_names = [ast.unparse(b) for b in node.bases]
    if default_base is None:
        unknown = [b for b in base_names if b not in bases]
        assert not unknown, f"{name}'s bases {base_names} changed: {unknown} not stood in"
        new_bases = [ast.Name(b, ast.Load()) for b in base_names]
    else:
        new_bases = [ast.Name("_default_base", ast.Load())]
    body = [_strip_annotations(f) for f in node.body
            if isinstance(f, ast.FunctionDef) and f.name in METHODS]
    cls = ast.ClassDef(name=name, bases=new_bases, keywords=[], body=body or [ast.Pass()],
                       decorator_list=[], type_params=[])
    mod = ast.fix_missing_locations(ast.Module(body=[cls], type_ignores=[]))
    ns = {"torch": torch, "nn": nn, "F": F, "_default_base": default_base, **bases}
    exec(compile(mod, str(tree / SOURCES[key]), "exec"), ns)  # noqa: S102 - vLLM's source
    return ns[name]


def compile_function(tree: Path, key: str, name: str, ns: dict) -> object:
    """vLLM's module-level function ``name`` from the source (line numbers kept)."""
    fns = [_strip_annotations(n) for n in ast.parse((tree / SOURCES[key]).read_text()).body
           if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(fns) == 1, f"{SOURCES[key]}: function {name} not found"
    mod = ast.fix_missing_locations(ast.Module(body=fns, type_ignores=[]))
    exec(compile(mod, str(tree / SOURCES[key]), "exec"), ns)  # noqa: S102 - vLLM's source
    return ns[name]


def vocab_functions(tree: Path) -> dict:
    """vLLM's ``pad_vocab_size`` and ``vocab_range_from_global_vocab_size``."""
    src = (tree / SOURCES["vocab"]).read_text()
    want = ("pad_vocab_size", "vocab_range_from_per_partition_vocab_size",
            "vocab_range_from_global_vocab_size")
    fns = [_strip_annotations(n) for n in ast.parse(src).body
           if isinstance(n, ast.FunctionDef) and n.name in want]
    assert len(fns) == len(want), f"{SOURCES['vocab']}: expected {want}"

    def divide(a: int, b: int) -> int:  # vllm.distributed.utils.divide
        assert a % b == 0, f"{a} is not divisible by {b}"
        return a // b

    ns = {"divide": divide, "DEFAULT_VOCAB_PADDING_SIZE": 64}
    mod = ast.fix_missing_locations(ast.Module(body=fns, type_ignores=[]))
    exec(compile(mod, str(tree / SOURCES["vocab"]), "exec"), ns)  # noqa: S102
    return ns


class Vllm:
    """The loaded pieces: ``LogitsProcessor``, the model stand-ins and the shard ranges."""

    def __init__(self, tree: Path):
        self.lp = load_logits_processor(tree)
        self.vocab = vocab_functions(tree)
        mixin = compile_class(tree, "interfaces", "LocalArgmaxMixin", {}, default_base=object)
        self.DeepseekV2 = compile_class(tree, "deepseek_v2", "DeepseekV2ForCausalLM", {},
                                        default_base=nn.Module)
        # the EAGLE-3 heads' shared guard (patch 0002), called by name from the head
        refuse = compile_function(tree, "interfaces", "refuse_local_logits_with_draft_vocab",
                                  {"nn": nn})
        self.Eagle3 = compile_class(tree, "deepseek_eagle3", "Eagle3DeepseekV2ForCausalLM",
                                    {"LocalArgmaxMixin": mixin,
                                     "DeepseekV2ForCausalLM": self.DeepseekV2,
                                     "refuse_local_logits_with_draft_vocab": refuse})
        self.KimiK25 = compile_class(tree, "kimi_k25", "KimiK25ForConditionalGeneration", {},
                                     default_base=nn.Module)

    def shard(self, vocab_size: int, rank: int, tp: int) -> tuple[int, int]:
        """Rank ``rank``'s rows ``[lo, hi)`` of the padded head (``ParallelLMHead``)."""
        padded = self.vocab["pad_vocab_size"](vocab_size)
        return tuple(self.vocab["vocab_range_from_global_vocab_size"](padded, rank, tp))


@pytest.fixture(scope="module")
def vllm():
    tree = vllm_tree()
    if tree is None:
        pytest.skip("no patched vLLM 0.34.0 source tree (.vllm_src/ or build/vllm-0.34.0/ "
                    f"with {', '.join(SOURCES.values())})")
    return Vllm(tree)


# ---------------------------------------------------------------------------------------------
# simulated ranks
# ---------------------------------------------------------------------------------------------
class StubLMHead(nn.Module):
    """One rank's ``ParallelLMHead``: its rows of the padded weight; ``quant_method.apply``
    is ``F.linear`` as vLLM's unquantized embedding method on CUDA."""

    def __init__(self, weight: torch.Tensor, tp_size: int):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.tp_size = tp_size
        self.quant_method = types.SimpleNamespace(
            apply=lambda layer, x, bias=None: F.linear(x, layer.weight, bias))


def padded_weight(vllm: Vllm, vocab_size: int, hidden: int, gen, device) -> torch.Tensor:
    padded = vllm.vocab["pad_vocab_size"](vocab_size)
    w = torch.zeros(padded, hidden, dtype=torch.bfloat16)
    w[:vocab_size] = (torch.randn(vocab_size, hidden, generator=gen) / hidden ** 0.5).to(
        torch.bfloat16)
    return w.to(device)


def ranks(vllm: Vllm, make, weight: torch.Tensor, vocab_size: int, tp: int) -> list:
    """``tp`` models (``make(lm_head, processor)``) each holding its rank's rows."""
    out = []
    for r in range(tp):
        lo, hi = vllm.shard(vocab_size, r, tp)
        out.append(make(StubLMHead(weight[lo:hi].contiguous(), tp),
                        vllm.lp.LogitsProcessor(vocab_size)))
    return out


def gathered(vllm: Vllm, models: list, h: torch.Tensor, fn: str) -> list[torch.Tensor]:
    """``getattr(model, fn)(h)`` on every simulated rank; the all-gather inside returns every
    rank's ``LogitsProcessor(lm_head, h, skip_gather=True)`` (vLLM's code on its rows)."""
    local = [m.logits_processor(m.lm_head, h, skip_gather=True) for m in models]

    def all_gather(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        assert any(torch.equal(t, x) for x in local), "gathered a tensor no rank computed"
        return torch.cat(local, dim=dim)

    vllm.lp.tensor_model_parallel_all_gather = all_gather
    try:
        return [getattr(m, fn)(h) for m in models]
    finally:
        vllm.lp.tensor_model_parallel_all_gather = _no_collective


def deepseek(vllm: Vllm, lm_head, processor):
    m = vllm.DeepseekV2.__new__(vllm.DeepseekV2)
    nn.Module.__init__(m)
    m.lm_head, m.logits_processor = lm_head, processor
    return m


def eagle3(vllm: Vllm, d2t: torch.Tensor | None, vocab_size: int, draft_vocab: int):
    def make(lm_head, processor):
        m = vllm.Eagle3.__new__(vllm.Eagle3)
        nn.Module.__init__(m)
        m.config = types.SimpleNamespace(vocab_size=vocab_size, draft_vocab_size=draft_vocab)
        m.lm_head, m.logits_processor = lm_head, processor
        m.draft_id_to_target_id = (None if d2t is None
                                   else nn.Parameter(d2t, requires_grad=False))
        return m

    return make


# ---------------------------------------------------------------------------------------------
# the checks (device-agnostic; the tests run them on CUDA in bf16)
# ---------------------------------------------------------------------------------------------
def check_local_is_the_shard(vllm: Vllm, make, vocab_size: int, hidden: int, rows: int,
                             device, head_vocab: int | None = None, seed: int = 0) -> None:
    """TP = 1: ``compute_logits_local`` (cut to the vocabulary) equals ``compute_logits``.
    TP = 8 by slicing: rank r's ``compute_logits_local`` equals rank r's shard of what
    ``compute_logits`` returns (bitwise: the same matmul), and the shards concatenated
    equal the TP = 1 logits up to bf16 GEMM rounding. ``head_vocab``: the head's own
    vocabulary when it differs from ``vocab_size`` (a d2t draft head)."""
    gen = torch.Generator().manual_seed(seed)
    hv = head_vocab or vocab_size
    w = padded_weight(vllm, hv, hidden, gen, device)
    h = torch.randn(rows, hidden, generator=gen).to(torch.bfloat16).to(device)
    [one] = ranks(vllm, make, w, hv, 1)
    full1 = one.compute_logits(h)
    assert full1.shape == (rows, vocab_size), full1.shape
    local1 = one.compute_logits_local(h)
    assert local1.shape[0] == rows and local1.shape[1] >= vocab_size, (
        f"TP=1: compute_logits_local returned {tuple(local1.shape)}, narrower than "
        f"compute_logits' vocabulary of {vocab_size} (a draft-vocabulary shard without the "
        "d2t remap?)")
    assert torch.equal(local1[:, :vocab_size], full1), "TP=1: local != compute_logits"
    models = ranks(vllm, make, w, hv, TP)
    fulls = gathered(vllm, models, h, "compute_logits")
    locals_ = [m.compute_logits_local(h) for m in models]
    width = -(-vllm.vocab["pad_vocab_size"](vocab_size) // TP)
    for r, (full, local) in enumerate(zip(fulls, locals_)):
        assert full.shape == (rows, vocab_size)
        lo, hi = r * width, min((r + 1) * width, vocab_size)
        assert local.shape == (rows, width), (r, tuple(local.shape), width)
        assert torch.equal(local[:, :hi - lo], full[:, lo:hi]), f"rank {r}: local != shard"
    cat = torch.cat(locals_, dim=1)[:, :vocab_size].float()
    torch.testing.assert_close(cat, full1.float(), rtol=1.6e-2, atol=1e-2)  # bf16 GEMMs


def check_d2t_head(vllm: Vllm, vocab_size: int, draft_vocab: int, hidden: int, rows: int,
                   device, seed: int = 0) -> str:
    """The d2t contract (module docstring): "shard" or "refused"."""
    gen = torch.Generator().manual_seed(seed)
    targets = torch.randperm(vocab_size, generator=gen)[:draft_vocab].sort().values
    d2t = (targets - torch.arange(draft_vocab)).to(device)
    make = eagle3(vllm, d2t, vocab_size, draft_vocab)
    w = padded_weight(vllm, draft_vocab, hidden, gen, device)
    [one] = ranks(vllm, make, w, draft_vocab, 1)
    h = torch.randn(rows, hidden, generator=gen).to(torch.bfloat16).to(device)
    try:
        one.compute_logits_local(h)
    except (NotImplementedError, ValueError, RuntimeError, AssertionError) as e:
        assert any(w in str(e) for w in D2T_WORDS), f"refused without naming d2t: {e}"
        return "refused"
    check_local_is_the_shard(vllm, make, vocab_size, hidden, rows, device,
                             head_vocab=draft_vocab, seed=seed)
    return "shard"


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------
DEVICE = "cuda"


def test_deepseek_v2_small_config(vllm):
    """A small DeepSeek-V2-family head: vocab 4000 (padded to 4032, 504 rows per rank)."""
    check_local_is_the_shard(vllm, lambda lm, p: deepseek(vllm, lm, p), 4000, 256, 12, DEVICE)


def test_kimi_vocabulary_at_tp8(vllm):
    """Kimi-K2.5's vocabulary (163840: 8 shards of 20480, no padding), hidden 256."""
    check_local_is_the_shard(vllm, lambda lm, p: deepseek(vllm, lm, p), 163840, 256, 16,
                             DEVICE, seed=1)


def test_kimi_k25_delegates_to_its_language_model(vllm):
    gen = torch.Generator().manual_seed(2)
    w = padded_weight(vllm, 4000, 128, gen, DEVICE)
    [lm] = ranks(vllm, lambda lm_head, p: deepseek(vllm, lm_head, p), w, 4000, 1)
    kimi = vllm.KimiK25.__new__(vllm.KimiK25)
    nn.Module.__init__(kimi)
    kimi.language_model = lm
    h = torch.randn(5, 128, generator=gen).to(torch.bfloat16).to(DEVICE)
    assert torch.equal(kimi.compute_logits_local(h), lm.compute_logits_local(h)), (
        "KimiK25ForConditionalGeneration.compute_logits_local != its language model's")
    assert torch.equal(kimi.compute_logits(h), lm.compute_logits(h))


def test_eagle3_deepseek_head_full_vocabulary(vllm):
    """No d2t (the draft vocabulary is the target's): the inherited method is the shard."""
    check_local_is_the_shard(vllm, eagle3(vllm, None, 163840, 163840), 163840, 128, 8,
                             DEVICE, seed=3)


def test_eagle3_deepseek_head_with_d2t(vllm):
    """A 32000-token draft vocabulary mapped into Kimi's 163840 by ``d2t``."""
    assert check_d2t_head(vllm, 163840, 32000, 128, 8, DEVICE, seed=4) in ("shard", "refused")

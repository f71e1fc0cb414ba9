import pytest


@pytest.fixture(autouse=True, scope="session")
def _vllm_single_rank():
    """vLLM layers read the TP group at construction: one gloo rank per test process."""
    try:
        from testkit.vllm_cpu import ensure_single_rank
    except ImportError:
        return
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        ensure_single_rank()


@pytest.fixture(autouse=True)
def _restore_transformers_config_model_types():
    """vLLM 0.34.0's config loader assigns ``model_type`` on shared transformers
    config classes (``_register_config_class``): after loading a ``kimi_k2``
    config, ``DeepseekV3Config.model_type`` is "kimi_k2" for the rest of the
    process, so a later DeepSeek-V3 checkpoint is no longer recognised (e.g. not
    rewritten to its MTP architecture). Tests share one process; undo that."""
    try:
        from transformers import DeepseekV3Config
    except ImportError:
        yield
        return
    DeepseekV3Config.model_type = "deepseek_v3"  # a module fixture may have run first
    yield
    DeepseekV3Config.model_type = "deepseek_v3"


@pytest.fixture(scope="session")
def draft_tp_heads(tmp_path_factory):
    """A tiny EAGLE-3 head and a tiny DFlash drafter for the tiny Kimi-K2.5
    target, shared by the draft-TP configuration tests."""
    from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3
    from testkit.draft_scenarios import write_tiny_dflash

    root = tmp_path_factory.mktemp("cfg-heads")
    write_tiny_eagle3(root / "eagle3", TinyKimiSpec(), TinyEagle3Spec())
    write_tiny_dflash(root / "dflash", TinyKimiSpec())
    return root


@pytest.fixture()
def tp2_config(tiny_kimi_dir):
    """``tp2_config(speculative_config)``: vLLM's own config path for the tiny
    Kimi-K2.5 target at tensor_parallel_size=2."""
    from testkit.vllm_cpu import make_vllm_config

    return lambda spec: make_vllm_config(tiny_kimi_dir, tensor_parallel_size=2,
                                         speculative_config=spec)


@pytest.fixture()
def eagle3_config():
    """``eagle3_config(target_dir, draft_dir)``: vLLM's own config path for an
    EAGLE-3 head (2 speculative tokens) on a target, at TP=1."""
    from testkit.vllm_cpu import make_vllm_config

    return lambda target_dir, draft_dir: make_vllm_config(target_dir, speculative_config={
        "method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": 2})


@pytest.fixture()
def eagle3_tp2_compile_factors(tp2_config, draft_tp_heads):
    """``eagle3_tp2_compile_factors(**options)``: the speculative config's compile
    factors for the shared EAGLE-3 head at TP=2 with extra options."""
    base = {"method": "eagle3", "model": str(draft_tp_heads / "eagle3"),
            "num_speculative_tokens": 3}
    return lambda **options: tp2_config({**base, **options}).speculative_config.compile_factors()


@pytest.fixture()
def kimi_mtp_drafts():
    """The plugin's "Kimi-K2.5 MTP drafts" runtime patches (R10/R11) installed for one
    test, and taken out after it."""
    from testkit.runtime_patches import installed

    with installed("Kimi-K2.5 MTP drafts"):
        yield

import pytest


@pytest.fixture(autouse=True, scope="session")
def _vllm_single_rank():
    """vLLM layers read the TP group at construction: one gloo rank per test process."""
    try:
        from vllm_kimi_ext.testing.vllm_cpu import ensure_single_rank
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

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

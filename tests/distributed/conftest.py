import pytest


@pytest.fixture(scope="session")
def tp2_target_results(tiny_kimi_dir):
    """One TP=2 run of the tiny Kimi-K2.5 target shared by several test files
    (spawning ranks costs ~20 s on 2 cores)."""
    from vllm_kimi_ext.testing.distributed import run_tp
    from vllm_kimi_ext.testing.tp_scenarios import target_pass_collectives

    return run_tp(target_pass_collectives, 2, str(tiny_kimi_dir), 4)

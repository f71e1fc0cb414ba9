"""The engine child's environment (:func:`testkit.engine.engine_env`) does not depend on
which tests ran earlier in the same pytest process."""

from __future__ import annotations

import pytest

from testkit.engine import EngineSpec, engine_env


@pytest.mark.parametrize(("inherited", "child"), [
    (None, "INFO"),
    ("WARNING", "INFO"),  # testkit.vllm_cpu.prepare_process ran in this process
    ("ERROR", "INFO"),
    ("INFO", "INFO"),
    ("DEBUG", "DEBUG"),
])
def test_the_child_logs_the_info_lines_engine_tests_read(inherited, child):
    base = {} if inherited is None else {"VLLM_LOGGING_LEVEL": inherited}
    assert engine_env(EngineSpec(model="m"), base=base)["VLLM_LOGGING_LEVEL"] == child


def test_a_spec_still_sets_any_level():
    spec = EngineSpec(model="m", env={"VLLM_LOGGING_LEVEL": "ERROR"})
    assert engine_env(spec, base={"VLLM_LOGGING_LEVEL": "WARNING"})["VLLM_LOGGING_LEVEL"] == "ERROR"

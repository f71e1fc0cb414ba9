"""The engine tier: vLLM 0.34.0's whole engine on CPU (``testkit/engine.py``); the shared
cases are in ``testkit/engine_cases.py``."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def llama(tmp_path_factory):
    """The tiny Llama target and its drafts: name -> directory."""
    from testkit import engine_models as em

    root = tmp_path_factory.mktemp("engine-llama")
    return {"target": str(em.write_llama_target(root / "target")),
            "eagle": str(em.write_llama_eagle(root / "eagle")),
            "eagle3": str(em.write_llama_eagle3(root / "eagle3")),
            "draft_model": str(em.write_llama_draft_model(root / "draft_model"))}

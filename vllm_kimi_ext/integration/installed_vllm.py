"""What the installed vLLM carries, for checks that also run without vLLM (the doctor)."""

from __future__ import annotations


def keeps_eagle3_deepseek_heads() -> bool:
    """Whether the installed vLLM carries the fix that keeps DeepSeek-type EAGLE-3 heads out
    of the MTP rewrite (our patch adds ``vllm.config.speculative._is_eagle3_draft_architecture``);
    False without vLLM or when it cannot be imported."""
    try:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            return False
        from vllm.config import speculative
    except Exception:  # noqa: BLE001 - any import problem means "stock"
        return False
    return hasattr(speculative, "_is_eagle3_draft_architecture")

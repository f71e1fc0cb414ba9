"""Lossless drafting with another tokenizer (Token-Level Intersection): the algorithm
(:mod:`.cross_tokenizer`), the index maps a serving engine needs (:mod:`.maps`) and their
Triton gather (:mod:`._triton`). The vLLM side is ``vllm_kimi_ext.integration.tli_config``.
"""

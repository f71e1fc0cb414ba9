"""Draft-checkpoint tools, one sub-package per job (no vLLM import anywhere below).

* :mod:`.doctor`: checks a draft against a Kimi-K2.5 target before anything is served;
* :mod:`.shrink_vocab`: reduces a full-vocabulary EAGLE-3 head to a frequent-token one;
* :mod:`.tli`: the Token-Level-Intersection maps of a draft with another tokenizer;
* :mod:`.cli`: the ``doctor`` and ``draft ...`` subcommands of ``vllm-kimi-ext``.
"""

"""``vllm-kimi-ext draft shrink-vocab``: a full-vocabulary EAGLE-3 head reduced to the
tokens a corpus uses most (:mod:`.shrink`), reading corpora (:mod:`.corpus`) and writing
the output directory whole or not at all (:mod:`.output_dir`).
"""

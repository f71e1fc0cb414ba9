"""vllm-kimi-ext: lossless, communication-lean speculative decoding for Kimi-K2.5.

Importing this package must stay cheap and must not import vLLM: the kernels
under ``vllm_kimi_ext.verify`` and the cost model run on machines without vLLM.
"""

__version__ = "0.1.0"

#: The only upstream release this package (its plugin and its patch series) supports.
PINNED_VLLM_VERSION = "0.34.0"

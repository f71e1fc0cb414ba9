"""Checkpoint files read without loading a model: safetensors headers, local directories.

Standard library only (no vLLM, no torch); used by the draft doctor, ``shrink-vocab``,
the training tools and the configuration-time checks.
"""

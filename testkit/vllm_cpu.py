"""Run vLLM's real model classes on a GPU-less, Python-only vLLM build.

The path is vLLM's own: ``EngineArgs → VllmConfig`` (config parsing, the
speculative-config rewrites, the architecture registry), the model loader's
``create_model`` / ``load_weights`` / ``process_weights_after_loading``, and the
models' ``forward`` / ``compute_logits`` under a forward context. What a
GPU-less install lacks is bridged narrowly and only here:

* vLLM's CPU platform refuses to configure on x86 without triton-cpu
  ("vLLM on x86 CPUs requires Triton"). :func:`cpu_config_without_triton_cpu`
  lets *configuration* proceed; nothing here runs a Triton kernel.
* ``torch.ops._C`` MoE ops are replaced by plain-torch stand-ins
  (:mod:`testkit.cpu_stand_ins`).
* Attention runs vLLM's metadata-free path (``attn_metadata=None``): shapes,
  weights and every tensor-parallel collective are real; attention scores are
  not computed. Tests that need token-exact attention do not use this path.

Everything is opt-in for tests; the plugin never imports this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def prepare_process() -> None:
    """Per-process setup: CPU platform, stand-ins, quiet logs."""
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from testkit import cpu_stand_ins

    cpu_stand_ins.install()


@contextlib.contextmanager
def cpu_config_without_triton_cpu() -> Iterator[None]:
    """Scoped: let ``CpuPlatform.check_and_update_config`` run without triton-cpu."""
    import vllm.triton_utils as triton_utils

    saved = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = saved


def make_vllm_config(
    model: str | Path,
    *,
    tensor_parallel_size: int = 1,
    speculative_config: dict | None = None,
    max_model_len: int = 256,
    **engine_kwargs: Any,
):
    """Build a ``VllmConfig`` through ``EngineArgs`` exactly as ``vllm serve`` does."""
    from vllm.engine.arg_utils import EngineArgs

    prepare_process()
    args = EngineArgs(
        model=str(model),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=max_model_len,
        enforce_eager=True,
        tensor_parallel_size=tensor_parallel_size,
        distributed_executor_backend="mp" if tensor_parallel_size > 1 else None,
        compilation_config={"custom_ops": ["none"]},
        speculative_config=speculative_config,
        **engine_kwargs,
    )
    with cpu_config_without_triton_cpu():
        return args.create_engine_config()


@dataclasses.dataclass
class LoadReport:
    """What the loader did: parameters left unwritten, tensors offered, count."""

    num_parameters: int
    unwritten: list[str]
    checkpoint_tensors: list[str]


def _poison(model) -> None:
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dtype.is_floating_point:
                p.fill_(float("nan"))
            else:
                p.fill_(torch.iinfo(p.dtype).min if p.dtype != torch.bool else True)


def _unwritten(model) -> list[str]:
    import torch

    bad = []
    for name, p in model.named_parameters():
        if p.dtype.is_floating_point:
            if torch.isnan(p.float()).any():
                bad.append(name)
        elif p.dtype != torch.bool and (p == torch.iinfo(p.dtype).min).any():
            bad.append(name)
    return bad


def load_model(vllm_config, model_config=None, *, poison: bool = True, process: bool = True):
    """Create and load a model with vLLM's loader; prove every parameter was written.

    Mirrors ``BaseModelLoader.load_model`` step by step (create → load_weights →
    process_weights_after_loading) with a poison fill in between: each
    parameter is set to NaN (integers to their minimum) before loading and
    checked after, so a parameter the checkpoint did not provide is reported
    even if vLLM's own "weights not initialized" check misses it (e.g. a
    parameter filled by a fallback). ``process=False`` stops before
    ``process_weights_after_loading`` (kernel-specific repacking), leaving the
    parameters as the checkpoint filled them. Returns ``(model, LoadReport)``.
    """
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    model_config = model_config or vllm_config.model_config
    loader = get_model_loader(vllm_config.load_config)
    offered: list[str] = []
    original_get_all = getattr(loader, "get_all_weights", None)

    def recording_get_all(mc, m):
        for name, tensor in original_get_all(mc, m):
            offered.append(name)
            yield name, tensor

    with set_current_vllm_config(vllm_config):
        with set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
            model = loader.create_model(vllm_config=vllm_config, model_config=model_config)
        if poison:
            _poison(model)
        if original_get_all is not None:
            loader.get_all_weights = recording_get_all
        try:
            loader.load_weights(model, model_config)
        finally:
            if original_get_all is not None:
                del loader.get_all_weights
        report = LoadReport(
            num_parameters=sum(1 for _ in model.parameters()),
            unwritten=_unwritten(model) if poison else [],
            checkpoint_tensors=offered,
        )
        if process:
            process_weights_after_loading(model, model_config, torch.device("cpu"))
    return model.eval(), report


def run_forward(model, vllm_config, input_ids, positions, **kwargs):
    """One metadata-free forward pass (see module docstring) → hidden states."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    with set_current_vllm_config(vllm_config), torch.no_grad():
        with set_forward_context(None, vllm_config):
            return model(input_ids=input_ids, positions=positions, **kwargs)


def compute_logits(model, vllm_config, hidden_states):
    import torch
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(vllm_config), torch.no_grad():
        return model.compute_logits(hidden_states)


def load_checked_kimi_mtp(vllm_config, n_predict: int = 1):
    """Load the configured Kimi-K2.5 MTP draft with :func:`load_model` and assert
    what every Kimi MTP test expects: ``KimiK25MTPModel`` / ``deepseek_mtp`` with
    ``n_predict`` layers, class ``KimiK25MTP``, every parameter written."""
    draft = vllm_config.speculative_config.draft_model_config
    assert draft.architectures == ["KimiK25MTPModel"], draft.architectures
    assert draft.hf_config.model_type == "deepseek_mtp"
    assert draft.hf_config.n_predict == n_predict
    model, report = load_model(vllm_config, draft)
    assert type(model).__name__ == "KimiK25MTP"
    assert report.unwritten == [], report.unwritten[:5]
    return model, report


def check_mtp_forward(model, vllm_config, hidden_size: int, vocab_size: int) -> None:
    """One metadata-free MTP forward (4 tokens, random previous hidden states) +
    logits; asserts the shapes and that the logits are finite."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    ids = torch.tensor([1, 5, 7, vocab_size - 1])
    pos = torch.arange(4)
    prev = torch.randn(4, hidden_size, dtype=torch.bfloat16)
    with (set_current_vllm_config(vllm_config), torch.no_grad(),
          set_forward_context(None, vllm_config)):
        hidden, _ = model(ids, pos, prev, inputs_embeds=model.embed_input_ids(ids))
        logits = model.compute_logits(hidden)
    assert hidden.shape == (4, hidden_size)
    assert logits.shape[0] == 4 and logits.shape[1] >= vocab_size
    assert torch.isfinite(logits[:, :vocab_size].float()).all()


def ensure_single_rank() -> None:
    """Initialise vLLM's distributed state as one rank (gloo), once per process."""
    from vllm.distributed import parallel_state

    if parallel_state._TP is not None:
        return
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    from testkit.ports import free_port

    prepare_process()
    with cpu_config_without_triton_cpu():
        bare = VllmConfig()
    with set_current_vllm_config(bare):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
        initialize_model_parallel(tensor_model_parallel_size=1)

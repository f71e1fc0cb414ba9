"""vLLM 0.34.0's verification kernels loaded for the GPU benches, and their report helpers.

vLLM's kernels are imported from the unmodified 0.34.0 source files without importing
the vLLM package (whose ``__init__`` needs pydantic and friends): the handful of modules
``rejection_sampler_utils`` and ``topk_topp_triton`` need are loaded from ``--vllm-src``
(a directory containing ``vllm/``) under stub parent packages; the only stubs are objects
those modules import but the benchmarked functions never call (tensor-parallel group
lookup, the input-batch type, batch-shard helpers, platform queries). If a regular vLLM
install is importable it is used instead. To run on a bare GPU machine, copy the files
listed in ``VLLM_FILES`` and ``VLLM_TOPP_FILES`` from the vLLM 0.34.0 sdist into
``.vllm_src/`` (same relative paths; git-ignore it) and take that folder along. The
reports record the sha256 of each file used.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import importlib
import json
import os
import platform
import subprocess
import sys
import types
from pathlib import Path

import torch

V = 163840
TP = 8
K = 3

VLLM_FILES = (
    "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
    "vllm/v1/worker/gpu/spec_decode/draft_logits.py",
    "vllm/v1/worker/gpu/spec_decode/fly.py",
    "vllm/v1/worker/gpu/sample/gumbel.py",
    "vllm/v1/worker/gpu/sample/watermark.py",
    "vllm/v1/watermarking/prfs/base.py",
    "vllm/v1/watermarking/prfs/philox.py",
    "vllm/utils/math_utils.py",
)


# ---------------------------------------------------------------------------
# vLLM's kernel
# ---------------------------------------------------------------------------
def _stub_module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def load_vllm_rejection_sample(src: Path | None):
    """Return ``(rejection_sample, info)``; raises with a reason on failure."""
    try:
        import vllm

        mod = importlib.import_module("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils")
        return mod.rejection_sample, {"how": "installed vllm", "version": vllm.__version__,
                                      "file": mod.__file__}
    except Exception:  # noqa: BLE001 - fall back to the source files
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
    if src is None:
        raise RuntimeError("vLLM is not importable and no --vllm-src was given")
    root = Path(src).resolve()
    missing = [f for f in VLLM_FILES if not (root / f).exists()]
    if missing:
        raise RuntimeError(f"--vllm-src lacks {missing}")
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice

    for pkg in ("vllm", "vllm.v1", "vllm.v1.worker", "vllm.v1.worker.gpu",
                "vllm.v1.worker.gpu.sample", "vllm.v1.worker.gpu.spec_decode",
                "vllm.v1.watermarking", "vllm.v1.watermarking.prfs", "vllm.utils",
                "vllm.distributed"):
        m = _stub_module(pkg)
        m.__path__ = [str(root.joinpath(*pkg.split(".")))]
    _stub_module("vllm.triton_utils", triton=triton, tl=tl, tldevice=tldevice, HAS_TRITON=True)

    def _never(*a, **k):
        raise RuntimeError("not used by rejection_sample")

    _stub_module("vllm.distributed.parallel_state", get_tp_group=_never)
    _stub_module("vllm.v1.worker.gpu.input_batch", InputBatch=object)

    @triton.jit
    def _unused(x, n):
        return x

    _stub_module("vllm.v1.worker.gpu.sample.batch_shard", shard_owner=_unused,
                 shard_owners=_never, shard_row=_unused, shard_rows=_never)
    mod = importlib.import_module("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils")
    sha = {f: hashlib.sha256((root / f).read_bytes()).hexdigest()[:16] for f in VLLM_FILES}
    return mod.rejection_sample, {"how": "unmodified 0.34.0 source files, stub parents",
                                  "version": "0.34.0", "sha256_16": sha}


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------


def provenance(vllm_info) -> dict:
    import triton

    p = torch.cuda.get_device_properties(0)
    smi = ""
    try:
        query = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit"
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False).stdout.strip()
    except Exception as e:  # noqa: BLE001
        smi = f"nvidia-smi failed: {e}"
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": p.name,
        "sm_count": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "capability": f"{p.major}.{p.minor}",
        "nvidia_smi": smi,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "vllm_kernel": vllm_info,
    }




def write_report(report: dict, out_dir: Path, name: str, to_markdown) -> None:
    """``<name>.json`` + ``<name>.md`` into ``out_dir`` (and ``$OUT`` when set); print the table."""
    dirs = [out_dir] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.json").write_text(json.dumps(report, indent=1, default=str))
        (d / f"{name}.md").write_text(to_markdown(report))
    print(to_markdown(report))



VLLM_TOPP_FILES = (
    "vllm/v1/sample/ops/topk_topp_triton.py",
    "vllm/model_executor/warmup/jit_warmup.py",
    "vllm/model_executor/warmup/jit_warmup_triton_helper.py",
)


# ---------------------------------------------------------------------------
# vLLM's top-k/top-p kernel
# ---------------------------------------------------------------------------
class _CudaPlatform:
    device_type = "cuda"

    def __getattr__(self, name):
        if name.startswith("is_"):
            return lambda *a, **k: name in ("is_cuda", "is_cuda_alike")
        raise AttributeError(name)


def load_vllm_top_k_top_p(src: Path | None, installed: bool):
    """``(apply_top_k_top_p_triton, apply_temperature, info)``; call after
    :func:`load_vllm_rejection_sample` (``installed``: it used an installed vLLM;
    otherwise this extends its stub parents)."""
    if installed:
        mod = importlib.import_module("vllm.v1.sample.ops.topk_topp_triton")
        gum = importlib.import_module("vllm.v1.worker.gpu.sample.gumbel")
        return mod.apply_top_k_top_p_triton, gum.apply_temperature, {"how": "installed vllm"}
    if src is None:
        raise RuntimeError("no --vllm-src")
    root = Path(src).resolve()
    missing = [f for f in VLLM_TOPP_FILES if not (root / f).exists()]
    if missing:
        raise RuntimeError(f"--vllm-src lacks {missing}")
    for pkg in ("vllm.model_executor", "vllm.model_executor.warmup", "vllm.v1.sample",
                "vllm.v1.sample.ops"):
        m = _stub_module(pkg)
        m.__path__ = [str(root.joinpath(*pkg.split(".")))]
    envs = _stub_module("vllm.envs", VLLM_TRITON_JIT_WARMUP_NUM_THREADS=1)
    sys.modules["vllm"].envs = envs
    _stub_module("vllm.platforms", current_platform=_CudaPlatform())
    _stub_module("vllm.utils.gpu_sync_debug", gpu_sync_allowed=contextlib.nullcontext)
    _stub_module("vllm.utils.platform_utils", num_compute_units=lambda index=None:
                 torch.cuda.get_device_properties(index or 0).multi_processor_count)
    mod = importlib.import_module("vllm.v1.sample.ops.topk_topp_triton")
    gum = importlib.import_module("vllm.v1.worker.gpu.sample.gumbel")
    sha = {f: hashlib.sha256((root / f).read_bytes()).hexdigest()[:16] for f in VLLM_TOPP_FILES}
    return mod.apply_top_k_top_p_triton, gum.apply_temperature, {
        "how": "unmodified 0.34.0 source files, stub parents", "sha256_16": sha}



# ---------------------------------------------------------------------------
# inputs

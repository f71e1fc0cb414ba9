"""Count what one verification step launches, off the GPU: the device work a CUDA graph of
the step would hold, recorded without running it.

:func:`count_step` runs :class:`~vllm_kimi_ext.verify.graph_step.GraphVerifyStep` on the
Triton backend on CPU tensors with every Triton launch replaced by a recorder (kernel name
and grid; nothing executes, so the step's outputs are garbage) and every torch operator that
would launch a device kernel recorded by a ``TorchDispatchMode`` (views, shape queries and
allocations launch nothing and are not recorded). The all-gathers are a
:class:`~vllm_kimi_ext.verify.ranks.CountingAllGather` over one rank's tensor repeated
``TP`` times. The step reads no device value on the host (it is graph-safe), so its
sequence of launches and collectives depends on the plan alone, never on the logits: what is
recorded here is what a captured graph replays.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from vllm_kimi_ext.verify.graph_step import GraphVerifyStep
from vllm_kimi_ext.verify.protocol import StepPlan
from vllm_kimi_ext.verify.ranks import CountingAllGather
from vllm_kimi_ext.verify.step_io import StepInputs

#: aten operators that launch no device kernel (views, metadata, allocation).
NO_LAUNCH = {
    "empty", "empty_like", "empty_strided", "view", "_unsafe_view", "reshape", "as_strided",
    "slice", "select", "unsqueeze", "squeeze", "expand", "permute", "transpose", "t",
    "alias", "detach", "lift_fresh", "view_as", "split", "unbind", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_contiguous", "_to_copy_noop", "view_dtype",
}


@dataclasses.dataclass
class StepCount:
    """One step's launches in order (``("triton", name, grid)`` or ``("aten", name)``), its
    collectives' bytes per rank and the plan."""

    launches: list
    gathers: list
    plan: StepPlan

    @property
    def names(self) -> list[str]:
        return [x[1] for x in self.launches]

    @property
    def bytes_sent(self) -> int:
        return sum(self.gathers)


class _AtenRecorder(TorchDispatchMode):
    def __init__(self, out: list):
        super().__init__()
        self.out = out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name.startswith("empty"):
            # the stubbed kernels never write: zeros keep the indices they would write valid
            out = func(*args, **(kwargs or {}))
            with _disable_current_modes():
                out.zero_()
            return out
        if name not in NO_LAUNCH and not (name == "view" or name.endswith("_view")):
            self.out.append(("aten", name))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def recording(out: list):
    """Record Triton launches (not run) and launching torch operators into ``out``."""
    from triton.runtime.jit import JITFunction

    def fake_getitem(self, grid):
        return lambda *a, **k: out.append(("triton", self.fn.__name__, tuple(grid)))

    old = JITFunction.__getitem__
    JITFunction.__getitem__ = fake_getitem
    try:
        with _AtenRecorder(out):
            yield out
    finally:
        JITFunction.__getitem__ = old


def count_step(logits: torch.Tensor, inp: StepInputs, plan: StepPlan, vocab_size: int,
               tp_size: int) -> StepCount:
    """Rank 0's step under :func:`recording` (one eager call first, as warm-up before
    capture allocates the step's persistent scratch; only the second call is counted)."""
    def gather(t):
        with _disable_current_modes():  # the collective itself is not a launch of the step
            return t[None].expand(tp_size, *t.shape).contiguous()

    ag = CountingAllGather(gather)
    step = GraphVerifyStep(vocab_size, tp_size, 0, ag, backend="triton")
    warm: list = []
    with recording(warm):
        step.run(logits, inp, plan)
    ag.calls.clear()
    out: list = []
    with recording(out):
        step.run(logits, inp, plan)
    return StepCount(out, [b for _, b in ag.calls], plan)

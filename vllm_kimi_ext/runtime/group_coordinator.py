"""Runtime patch of ``vllm.distributed.parallel_state.GroupCoordinator``.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm.distributed.parallel_state import GroupCoordinator

from vllm_kimi_ext.comm import accounting
from vllm_kimi_ext.patching import Patch


def _counted(op: str) -> Callable:
    def method(self, *args, **kwargs):
        return accounting.counted_call(self, op, GroupCoordinatorCounting.original(op),
                                       args, kwargs)

    method.__name__ = op
    method.__qualname__ = f"GroupCoordinatorCounting.{op}"
    return method


class GroupCoordinatorCounting(Patch[GroupCoordinator]):
    """Every collective of :data:`~vllm_kimi_ext.comm.accounting.COLLECTIVE_METHODS`
    is recorded by the active ``CollectiveCounter`` (inert while none is active)."""

    all_reduce = _counted("all_reduce")
    all_gather = _counted("all_gather")
    all_gatherv = _counted("all_gatherv")
    gather = _counted("gather")
    reduce_scatter = _counted("reduce_scatter")
    reduce_scatterv = _counted("reduce_scatterv")
    broadcast = _counted("broadcast")
    broadcast_tensor_dict = _counted("broadcast_tensor_dict")
    dispatch = _counted("dispatch")
    combine = _counted("combine")

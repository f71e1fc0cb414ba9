"""Sharded verification across real processes (gloo over TCP on 127.0.0.1).

Each rank holds only its vocabulary shard and exchanges statistics through
``torch.distributed.all_gather``; every rank checks its output against the
full-vocabulary reference, that all ranks agree, and that the collectives it
issued match ``comm_plan`` (see ``testkit.verify_dist_check``).
"""

from __future__ import annotations

import pytest

from testkit import verify_dist_check

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("world_size", [2, 4])
def test_sharded_verify_over_gloo(world_size):
    verify_dist_check.run(world_size, backend="gloo", vocab_size=1001)  # 1001: last shard padded

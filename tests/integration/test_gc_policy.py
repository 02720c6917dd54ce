"""Actor processes run Python's collector as ``actors.core.gc_policy`` says."""

from __future__ import annotations

import pytest

from rayless.actors import Cluster

pytestmark = pytest.mark.integration


class Collector:
    def settings(self) -> tuple[int, int]:
        import gc

        return gc.get_threshold()[0], gc.get_freeze_count()


async def test_an_actor_process_runs_the_collector_as_gc_policy_says(
    local_cluster: Cluster,
) -> None:
    tuned = await local_cluster.spawn(Collector)
    threshold, frozen = await tuned.settings()
    assert threshold >= 10_000 and frozen > 0  # its class and setup out of the collector's sight
    plain = await local_cluster.spawn(Collector, env={"RAYLESS_GC_GEN0": "0"})
    assert await plain.settings() == (700, 0)

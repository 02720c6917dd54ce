"""Chaos on the demo pipeline: kill -9 env/eval workers and storage units while it runs."""

from __future__ import annotations

import asyncio

import pytest

from rayless.actors import Cluster
from rayless.demo.config import load_config
from rayless.store import UnitLostError
from tests.chaos.scenarios import descendants, pipeline_chaos, until

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(300)]


@pytest.mark.slow
@pytest.mark.own_fork_templates  # it counts every process the run started
@pytest.mark.xdist_group("training")  # CPU-bound: one training test at a time
async def test_pipeline_survives_worker_kills_and_names_a_lost_unit() -> None:
    before = descendants()
    cfg = load_config()
    cfg.algo.iterations = 6
    cfg.algo.target_return = 10_000.0  # never "solved": run every iteration
    async with Cluster.local(nodes=2, gpus_per_node=2) as cluster:
        report = await pipeline_chaos(
            cluster, cfg, seed=1, actor_kills=3, kill_every=1.0, run_timeout=150.0
        )
    killed = {k.what for k in report.kills}
    assert killed >= {"unit"} and killed & {"env", "eval"}, report.kills
    assert all(k.detected_s is not None for k in report.kills), report.kills
    # The killed workers came back (max_restarts) behind their handles.
    for kill in report.kills:
        if kill.what in ("env", "eval"):
            assert report.restarts.get(kill.name, 0) >= 1, (kill, report.restarts)
    # The run completed, or failed with an error that names the lost unit.
    if report.error is not None:
        assert report.killed_unit is not None, report.error
        assert isinstance(report.error, UnitLostError), repr(report.error)
        assert report.error.unit == report.killed_unit
        assert report.killed_unit in str(report.error)
    else:
        assert report.result is not None and len(report.result.iterations) == 6
    # Every acknowledged put is readable, unless its unit died.
    assert report.acked_puts > 0
    assert report.acked_unreadable == [], report.acked_unreadable
    # Nothing is left behind: no actor of the run, no cluster process.
    assert report.leftover_pids == []
    assert await until(lambda: descendants() <= before, 20), descendants() - before


def test_pipeline_rejects_negative_max_restarts() -> None:
    from rayless.demo.pipeline import Pipeline

    with pytest.raises(ValueError, match="max_restarts"):
        Pipeline(load_config(), None, max_restarts=-1)  # type: ignore[arg-type]


async def test_scenario_helpers_poll_async_predicates() -> None:
    calls = []

    async def slow_true() -> bool:
        calls.append(1)
        await asyncio.sleep(0)
        return len(calls) >= 3

    assert await until(slow_true, 5)
    assert not await until(lambda: False, 0.05)

"""A pytest plugin for rayless users and this project's tests (registered as ``rayless``).

The ``local_cluster`` fixture gives a test a :class:`~actors.Cluster` of real processes on
loopback (a head, a zygote, N node agents with fake GPUs). Clusters of the same shape are
shared across a test session; each test gets its own session on it, so the actors it spawned
are killed when it ends. Choose the shape with a marker::

    @pytest.mark.local_cluster(nodes=3, gpus_per_node=2)
    async def test_my_trainer(local_cluster):
        handle = await local_cluster.spawn(Learner, gpus=1)

``isolated=True`` in the marker gives the test a cluster of its own (for tests that kill
agents or the head). A shared cluster's fork template imports torch ahead (``eager``); an
isolated one follows ``RAYLESS_ZYGOTE_PRELOAD``. ``local_cluster_processes`` exposes the
processes (pids, address, token) for fault injection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from rayless.actors.api.cluster import Cluster
from rayless.actors.api.runtime import get_runtime
from rayless.actors.core import context
from rayless.actors.launch.local import LocalProcesses

_SHARED: dict[tuple[int, int, float], LocalProcesses] = {}
DEFAULTS: dict[str, Any] = {"nodes": 2, "gpus_per_node": 2, "node_timeout": 5.0}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "local_cluster(nodes=2, gpus_per_node=2, node_timeout=5.0, isolated=False): "
        "the shape of the local_cluster fixture's cluster",
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for procs in _SHARED.values():
        procs.stop()
    _SHARED.clear()


def _shape(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("local_cluster")
    shape = dict(DEFAULTS)
    shape["isolated"] = False
    if marker is not None:
        shape.update(marker.kwargs)
    return shape


@pytest.fixture
def local_cluster_processes(request: pytest.FixtureRequest) -> Iterator[LocalProcesses]:
    """The processes behind ``local_cluster`` (shared unless the marker says isolated)."""
    shape = _shape(request)
    key = (int(shape["nodes"]), int(shape["gpus_per_node"]), float(shape["node_timeout"]))
    if shape["isolated"]:
        procs = LocalProcesses(*key)
        procs.start()
        try:
            yield procs
        finally:
            procs.stop()
        return
    shared: LocalProcesses | None = _SHARED.get(key)
    if shared is not None and (shared.head is None or shared.head.poll() is not None):
        shared.stop()
        shared = None
    if shared is None:  # its fork template holds torch from the start: many tests fork from it
        shared = LocalProcesses(*key, zygote_preload="eager")
        shared.start()
        _SHARED[key] = shared
    yield shared


@pytest.fixture
async def local_cluster(local_cluster_processes: LocalProcesses) -> AsyncIterator[Cluster]:
    """A Cluster on local processes; the actors this test spawns die when it ends."""
    info = context.ClusterInfo(local_cluster_processes.address, local_cluster_processes.token)
    context.set_current(info)
    cluster = Cluster(info)
    await get_runtime()
    try:
        yield cluster
    finally:
        await cluster.aclose()

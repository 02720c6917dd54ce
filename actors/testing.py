"""A pytest plugin for rayless users and this project's tests (registered as ``rayless``).

The ``local_cluster`` fixture gives a test a :class:`~actors.Cluster` of real processes on
loopback (a head, a zygote, N node agents with fake GPUs). Clusters of the same shape are
shared across a test session; each test gets its own session on it, so the actors it spawned
are killed when it ends. Choose the shape with a marker::

    @pytest.mark.local_cluster(nodes=3, gpus_per_node=2)
    async def test_my_trainer(local_cluster):
        handle = await local_cluster.spawn(Learner, gpus=1)

``isolated=True`` in the marker gives the test a cluster of its own (for tests that kill
agents or the head). ``local_cluster_processes`` exposes the processes (pids, address, token)
for fault injection.

Every local cluster the session's process starts (these, ``Cluster.local`` and
``ray.init`` in a test) forks its actors from the same two fork templates, started once and
kept until the session ends (``rayless.actors.launch.templates``): torch is imported once
per test process, not once per cluster. A test that needs a cluster with templates of its
own (it kills or stops them, counts the processes a cluster leaves, or checks a
``zygote_preload`` mode) says so with ``@pytest.mark.own_fork_templates``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from rayless.actors.api.cluster import Cluster
from rayless.actors.api.runtime import get_runtime
from rayless.actors.core import context
from rayless.actors.launch import templates
from rayless.actors.launch.local import LocalProcesses

_SHARED: dict[tuple[int, int, float], LocalProcesses] = {}
DEFAULTS: dict[str, Any] = {"nodes": 2, "gpus_per_node": 2, "node_timeout": 5.0}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "local_cluster(nodes=2, gpus_per_node=2, node_timeout=5.0, isolated=False): "
        "the shape of the local_cluster fixture's cluster",
    )
    config.addinivalue_line(
        "markers",
        "own_fork_templates: the local clusters this test starts get fork templates of their "
        "own instead of the session's shared ones",
    )
    templates.share(True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for procs in _SHARED.values():
        procs.stop()
    _SHARED.clear()
    templates.close()


@pytest.fixture(autouse=True)
def _own_fork_templates(request: pytest.FixtureRequest) -> Iterator[None]:
    """Sharing off for a test marked ``own_fork_templates``."""
    if request.node.get_closest_marker("own_fork_templates") is None:
        yield
        return
    was = templates.sharing()
    templates.share(False)
    try:
        yield
    finally:
        templates.share(was)


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

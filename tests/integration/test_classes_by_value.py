"""A dataclass of the driver's ``__main__`` or of a function travels with its class by value
(cloudpickle), which is code: processes that run user code (actors, drivers) load it; the
head and node agents load none, so a token holder's pickle runs nothing there."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from rayless.actors import Cluster
from rayless.ray.util import deregister_serializer, register_serializer
from rayless.transport.client import Client
from rayless.transport.errors import ProtocolError
from tests.integration.actor_classes import Counter

pytestmark = pytest.mark.integration


def _loud(mark: Path) -> Any:
    """An instance of a class whose unpickling creates ``mark`` (a class attribute whose
    ``__reduce__`` opens it for writing)."""

    class Touch:
        def __reduce__(self) -> Any:
            return (open, (str(mark), "w"))

    @dataclasses.dataclass
    class Loud:
        x: int

    Loud.side = Touch()  # type: ignore[attr-defined]
    return Loud(1)


class _Guarded:
    """A class the codec cannot send (it holds a lock) but for a registered serializer."""

    def __init__(self, x: int) -> None:
        self.x = x
        self.lock = threading.Lock()


def _register_loud(mark: Path) -> None:
    """Register a serializer of ``_Guarded`` whose deserializer's unpickling creates
    ``mark`` (its closure holds an object whose ``__reduce__`` opens it for writing)."""

    class Touch:
        def __reduce__(self) -> Any:
            return (open, (str(mark), "w"))

    side = Touch()

    def rebuild(x: int) -> _Guarded:
        assert side is not None
        return _Guarded(x)

    register_serializer(_Guarded, serializer=lambda g: g.x, deserializer=rebuild)


async def test_the_head_and_agents_load_no_deserializer_of_register_serializer(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    mark = tmp_path / "loaded"
    _register_loud(mark)
    try:
        counter = await local_cluster.spawn(Counter)
        agent = (await counter.env("RAYLESS_AGENT_ADDRESS"))["RAYLESS_AGENT_ADDRESS"]
        for address in (local_cluster.address, agent):
            async with Client(address, token=local_cluster.token, name="test") as peer:
                with pytest.raises(ProtocolError, match="does not load"):
                    await peer.request([_Guarded(3)], timeout=10)
        assert not mark.exists()
        # an actor process runs user code: it loads the deserializer (its unpickling ran),
        # then the method fails on the value it rebuilt
        with pytest.raises(TypeError, match="_Guarded"):
            await counter.add(_Guarded(3))
        assert mark.exists()
    finally:
        deregister_serializer(_Guarded)


async def test_the_head_and_agents_load_no_class_by_value(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    mark = tmp_path / "loaded"
    loud = _loud(mark)
    counter = await local_cluster.spawn(Counter)
    agent = (await counter.env("RAYLESS_AGENT_ADDRESS"))["RAYLESS_AGENT_ADDRESS"]
    assert agent
    for address in (local_cluster.address, agent):
        async with Client(address, token=local_cluster.token, name="test") as peer:
            for value in (loud, type(loud)):  # an instance, and the class sent by itself
                with pytest.raises(ProtocolError, match="does not load"):
                    await peer.request(value, timeout=10)
    assert not mark.exists()
    # an actor process runs user code: it loads the class (its unpickling ran), then the
    # method fails on the value
    with pytest.raises(TypeError):
        await counter.add(loud)
    assert mark.exists()

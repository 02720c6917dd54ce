"""SyncStore and SyncWeightSync carry every public member of their async class, with the same
signature, generated (so they cannot drift); and what the generated methods block for."""

from __future__ import annotations

import inspect

import pytest

from rayless.actors.api.blocking import (
    DEFAULT_TIMEOUT,
    RENAMED,
    SLACK,
    BlockingFace,
    public_members,
)
from rayless.store import Store, SyncStore
from rayless.weights import SyncWeightSync, WeightSync

FACES = [(SyncStore, Store), (SyncWeightSync, WeightSync)]


@pytest.mark.parametrize(("face", "cls"), FACES, ids=["SyncStore", "SyncWeightSync"])
def test_every_public_method_of_the_async_class_is_on_its_sync_face(face: type, cls: type) -> None:
    members = public_members(cls)
    assert any(inspect.iscoroutinefunction(m) for m in members.values())
    for name, member in members.items():
        own = getattr(face, RENAMED.get(name, name), None)
        assert own is not None, f"{face.__name__} lacks {name}"
        if isinstance(member, property):
            assert isinstance(own, property), name
            continue
        assert inspect.signature(own) == inspect.signature(member), name
        assert own.__doc__ == member.__doc__, name
    for opener in ("create", "connect"):  # the openers are the faces' own (they take a SyncCluster)
        assert opener in face.__dict__


def test_sync_weight_sync_publishes_shards() -> None:
    """Sharded publishing (docs/weights.md) through the blocking face."""
    params = inspect.signature(SyncWeightSync.publish).parameters
    assert {"shard", "num_shards", "group", "src"} <= set(params)


class _Echo:
    """An async class to wrap: what each generated method was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.store_id = "s1"

    @property
    def name(self) -> str:
        return "echo"

    async def timed(self, x: int, *, timeout: float | None = 5.0) -> int:
        return x + 1

    async def plain(self, x: int) -> int:
        return x * 2

    async def aclose(self) -> None:
        self.calls.append(("aclose", ()))

    def now(self, y: int) -> int:
        return y

    async def _private(self) -> None:  # never generated
        return None


class _SyncEcho(BlockingFace, face=_Echo):
    pass


def test_generated_methods_block_on_the_home_loop_for_the_calls_own_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits: list[float | None] = []

    def run_sync(aw: object, timeout: float | None = None) -> object:
        import asyncio

        limits.append(timeout)
        return asyncio.run(aw)  # type: ignore[arg-type]

    monkeypatch.setattr("rayless.actors.api.blocking.run_sync", run_sync)
    echo = _Echo()
    with _SyncEcho(echo) as face:
        assert face.timed(1) == 2 and face.timed(1, timeout=None) == 2
        assert face.timed(1, timeout=2) == 2 and face.plain(3) == 6
        assert face.now(7) == 7 and face.name == "echo" and face.store_id == "s1"
        assert not hasattr(face, "_private")
    assert limits == [5.0 + SLACK, None, 2 + SLACK, DEFAULT_TIMEOUT, DEFAULT_TIMEOUT]
    assert echo.calls == [("aclose", ())]  # leaving ``with`` closed it

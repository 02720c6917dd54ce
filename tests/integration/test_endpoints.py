"""The remote surface of an actor class: ``@endpoint`` makes it explicit (only the marked
methods are remote, a default deadline per method), and every call's arguments are checked
against the method's parameters in the caller, before anything is sent."""

from __future__ import annotations

import asyncio

import pytest

from rayless.actors import ActorHandle, Cluster, RemoteError, endpoint
from rayless.transport.errors import Timeout

pytestmark = pytest.mark.integration


class Surface:
    """Marks two methods: only they are remote."""

    def __init__(self) -> None:
        self.calls = 0

    @endpoint
    def add(self, x: int, y: int = 1, *, scale: int = 1) -> int:
        self.calls += 1
        return (x + y) * scale

    @endpoint(timeout=0.5)
    async def slow(self, seconds: float) -> str:
        self.calls += 1
        await asyncio.sleep(seconds)
        return "done"

    @endpoint
    def count(self) -> int:
        return self.calls

    @endpoint
    @staticmethod
    def pure(a: int, /, b: int) -> int:
        return a * b

    def internal_step(self) -> str:  # public, but not an endpoint: not remote
        return "internal"


class Plain:
    """Marks nothing: every public method is remote, as always; arguments are still checked."""

    def __init__(self) -> None:
        self.calls = 0

    def add(self, x: int, *more: int) -> int:
        self.calls += 1
        return x + sum(more)

    def count(self) -> int:
        return self.calls


async def test_a_class_with_endpoints_exposes_only_them(local_cluster: Cluster) -> None:
    h = await local_cluster.spawn(Surface)
    assert set(h.methods or {}) == {"add", "slow", "count", "pure"}
    with pytest.raises(AttributeError, match="no public method 'internal_step'"):
        h.internal_step  # noqa: B018
    # a handle built by hand (no method list) reaches the actor, which refuses it too
    blind = ActorHandle(h.actor_id, h.name, h.address, h.cls_name)
    with pytest.raises(RemoteError, match="has no public method 'internal_step'"):
        await blind.internal_step()
    assert await h.add(2, scale=3) == 9
    assert await h.pure(6, 7) == 42


async def test_wrong_arguments_are_a_type_error_in_the_caller(local_cluster: Cluster) -> None:
    h = await local_cluster.spawn(Surface)
    wrong = [
        ((), {}, "missing a required argument: 'x'"),
        ((1, 2, 3), {}, "too many positional arguments"),
        ((1,), {"nope": 2}, "unexpected keyword argument 'nope'"),
        ((1,), {"x": 2}, "multiple values for argument 'x'"),
    ]
    for args, kwargs, why in wrong:
        with pytest.raises(TypeError, match=rf"add\(\) of actor .*Surface.*{why}"):
            h.add(*args, **kwargs)
    with pytest.raises(TypeError, match="'a' parameter is positional only"):
        h.pure(a=1, b=2)
    plain = await local_cluster.spawn(Plain)
    assert await plain.add(1, 2, 3) == 6
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        plain.add()
    # nothing of the refused calls reached either actor
    assert (await h.count(), await plain.count()) == (0, 1)


async def test_blocking_and_ray_style_calls_are_checked_too(local_cluster: Cluster) -> None:
    h = await local_cluster.spawn(Plain)

    def from_a_thread() -> int:  # plain sync code: .call blocks, .remote gives a future
        with pytest.raises(TypeError, match="missing a required argument: 'x'"):
            h.add.call()
        with pytest.raises(TypeError, match="missing a required argument: 'x'"):
            h.add.remote()
        result: int = h.add.call(4, 5)
        return result

    assert await asyncio.to_thread(from_a_thread) == 9
    assert await h.count() == 1


async def test_an_endpoint_timeout_is_its_calls_default_deadline(local_cluster: Cluster) -> None:
    h = await local_cluster.spawn(Surface)
    assert await h.slow(0.0) == "done"
    with pytest.raises(Timeout):
        await h.slow(30.0)
    assert await h.slow.options(timeout=60.0)(0.6) == "done"  # the caller's choice wins
    assert await h.with_timeout(60.0).slow(0.6) == "done"


def test_endpoint_refuses_a_bad_timeout_and_a_non_callable() -> None:
    with pytest.raises(ValueError, match="positive number"):
        endpoint(timeout=0)
    with pytest.raises(TypeError, match="marks methods"):
        endpoint(3)


async def test_endpoint_still_gives_a_typed_view_of_a_handle(local_cluster: Cluster) -> None:
    h = await local_cluster.spawn(Surface)
    add = endpoint(h, Surface.add)
    assert await add(1, 1) == 2

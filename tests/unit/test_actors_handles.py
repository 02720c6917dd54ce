"""Strict actor handles, one call semantics, the sync portal and the openers (no processes)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect

import pytest

from rayless.actors import ActorHandle, Cluster, endpoint
from rayless.actors.api import portal
from rayless.actors.api.lifecycle import Opening, opener
from rayless.actors.core import context
from rayless.actors.protocol.messages import MethodInfo
from rayless.store import Store, SyncStore
from rayless.transport import codec
from rayless.transport.errors import ClosedError, RaylessError


class Counter:
    def add(self, k: int) -> int:
        return k

    async def aadd(self, k: int) -> int:
        return k


def counter_handle() -> ActorHandle[Counter]:
    return ActorHandle("id1", "c", "tcp://127.0.0.1:1", "Counter", {"add": False, "aadd": True})


def test_unknown_method_raises_at_once_naming_class_and_methods() -> None:
    h = counter_handle()
    with pytest.raises(AttributeError, match=r"\(Counter\) has no public method 'typo'.*aadd, add"):
        h.typo  # noqa: B018
    assert not hasattr(h, "typo") and hasattr(h, "add")
    assert {"add", "aadd", "name", "actor_id"} <= set(dir(h))


def test_private_and_dunder_names_are_refused_locally() -> None:
    h = counter_handle()
    with pytest.raises(AttributeError, match="no public method '_secret'"):
        h._secret  # noqa: B018
    with pytest.raises(AttributeError):
        h.__wrapped__  # noqa: B018
    assert not hasattr(h, "__array__")


def test_a_handle_without_a_method_list_is_permissive() -> None:
    h = ActorHandle("id1", "c", "tcp://x:1")
    assert h.anything.method == "anything"


def test_the_method_list_travels_with_the_handle() -> None:
    h = counter_handle()
    back = codec.decode(codec.encode(h))
    assert back == h and back.methods == {
        "add": MethodInfo(is_async=False),
        "aadd": MethodInfo(is_async=True),
    }
    with pytest.raises(AttributeError, match="no public method 'typo'"):
        back.typo  # noqa: B018


def test_a_call_outside_a_running_loop_names_call_and_remote() -> None:
    with pytest.raises(RuntimeError, match=r"\.add\.call\(\.\.\.\).*\.add\.remote"):
        counter_handle().add(1)


async def test_a_call_returns_a_future_in_every_case() -> None:
    saved = context._current
    context.set_current(None)
    try:
        fut = counter_handle().add(1)  # no cluster: the slow path, still a future
        assert isinstance(fut, asyncio.Future)
        assert isinstance(counter_handle().aadd.submit(1), asyncio.Future)
        with pytest.raises(RaylessError, match="not connected"):
            await fut
    finally:
        context.set_current(saved)


async def test_call_inside_a_running_loop_raises_instead_of_blocking_it() -> None:
    with pytest.raises(RuntimeError, match="running event loop"):
        counter_handle().add.call(1, timeout=1)


def test_remote_from_plain_code_returns_a_concurrent_future() -> None:
    saved = context._current
    context.set_current(None)
    try:
        fut = counter_handle().add.remote(1)
        assert isinstance(fut, concurrent.futures.Future)
        with pytest.raises(RaylessError, match="not connected"):
            fut.result(10)
    finally:
        context.set_current(saved)


def test_endpoint_gives_the_typed_method_and_checks_the_name() -> None:
    h = counter_handle()
    assert endpoint(h, Counter.add).method == "add"
    assert endpoint(h, Counter.aadd).method == "aadd"

    class Other:
        def nope(self) -> None: ...

    with pytest.raises(AttributeError, match="no public method 'nope'"):
        endpoint(h, Other.nope)  # type: ignore[arg-type]


def test_portal_runs_submits_and_closes() -> None:
    p = portal.Portal("test-portal")

    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    try:
        assert p.run(double(2), timeout=5) == 4
        assert p.submit(double(3)).result(5) == 6
    finally:
        p.stop()
        p.stop()  # idempotent
    with pytest.raises(ClosedError):
        p.submit(double(1))


def test_ctrl_c_while_waiting_on_a_portal_cancels_the_work() -> None:
    # Ctrl-C during Cluster.local_sync() left its start pending on the portal's loop, which
    # stop() then closed under it ("Task was destroyed but it is pending!", no cleanup ran)
    import signal
    import threading

    p = portal.Portal("test-portal")
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            p.run(forever(), timeout=30)
        assert started.is_set()
        assert cancelled.wait(5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        p.stop()


async def test_blocking_portal_calls_inside_a_loop_raise() -> None:
    async def nothing() -> None:
        return None

    with pytest.raises(RuntimeError, match="running event loop"):
        portal.run_sync(nothing())


class _Res:
    def __init__(self) -> None:
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


async def test_an_opening_is_awaitable_or_an_async_context_manager() -> None:
    @opener
    async def open_res() -> _Res:
        return _Res()

    res = await open_res()
    assert res.closed == 0
    async with open_res() as res2:
        assert res2.closed == 0
    assert res2.closed == 1
    once: Opening[_Res] = open_res()
    await once
    with pytest.raises(RuntimeError, match="already awaited"):
        await once


async def test_openers_return_openings() -> None:
    from rayless.actors import connect

    local = Cluster.local(nodes=1)
    assert isinstance(local, Opening) and isinstance(connect("tcp://x:1", token="t"), Opening)
    assert isinstance(Store.connect("s", None), Opening)
    with pytest.raises(ValueError, match="zygote_preload"):
        Cluster.local(zygote_preload="sometimes")


async def test_a_closed_cluster_raises_closed_error() -> None:
    cluster = Cluster(context.ClusterInfo("tcp://127.0.0.1:1", "t"), owns_session=False)
    await cluster.aclose()
    await cluster.aclose()  # idempotent
    assert cluster.closed
    with pytest.raises(ClosedError, match="closed"):
        await cluster.nodes()
    with pytest.raises(ClosedError):
        await cluster.spawn(Counter)


def test_sync_store_has_a_blocking_method_for_every_store_method() -> None:
    renamed = {"aclose": "close"}
    skip = {"create", "connect"}  # classmethods on both, checked below
    for name, fn in inspect.getmembers(Store, inspect.isfunction):
        if name.startswith("_") or name in skip:
            continue
        sync = getattr(SyncStore, renamed.get(name, name), None)
        assert sync is not None and inspect.isfunction(sync), f"SyncStore lacks {name}"
        assert not inspect.iscoroutinefunction(sync), name
        if name not in renamed:
            assert inspect.signature(sync).parameters.keys() == (
                inspect.signature(fn).parameters.keys()
            ), name
    for name in ("controller", "units", "owned", "closed"):  # store_id: an attribute, read through
        assert isinstance(inspect.getattr_static(SyncStore, name), property), name

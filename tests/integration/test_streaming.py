"""Generator methods stream their items to the caller (``actors.api.streams``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rayless.actors import Cluster, RemoteError, RemoteStream
from tests.integration.stream_classes import Streamer
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster(nodes=1, gpus_per_node=0)]


async def _stats(h: object) -> tuple[int, int]:
    return await h.stats()  # type: ignore[attr-defined,no-any-return]


async def test_def_and_async_generators_stream_every_item(local_cluster: Cluster) -> None:
    h = await local_cluster.spawn(Streamer)
    stream = await h.count(1000)
    assert isinstance(stream, RemoteStream)
    assert [x async for x in stream] == list(range(1000))
    assert [x async for x in await h.acount(5)] == [0, 1, 2, 3, 4]
    assert [x async for x in await h.count(0)] == []
    got = [t async for t in await h.tensors(3)]
    assert all(torch.equal(t, torch.full((1024,), float(i))) for i, t in enumerate(got))
    assert await h.plain() == "plain"  # the actor serves other calls as before


@pytest.mark.parametrize("method", ["forever", "aforever"])
async def test_a_stream_is_backpressured_and_closed_when_left(
    local_cluster: Cluster, method: str
) -> None:
    h = await local_cluster.spawn(Streamer)
    stream = await getattr(h, method)()
    assert await stream.__anext__() == 1
    await asyncio.sleep(0.3)  # the generator may run ahead, but not without bound
    produced, finalized = await _stats(h)
    assert produced < 200 and finalized == 0, produced
    await stream.aclose()
    await wait_until(lambda: _fin(h, 1), timeout=30, what="the generator's finally ran")
    async for _ in stream:  # a closed stream is empty
        raise AssertionError("items after aclose")


async def test_break_and_dropping_the_stream_close_the_generator(local_cluster: Cluster) -> None:
    h = await local_cluster.spawn(Streamer)
    stream = await h.forever()
    async for x in stream:
        if x == 3:
            break
    await stream.aclose()  # what `async with aclosing(...)` does after a break
    await wait_until(lambda: _fin(h, 1), timeout=30, what="closed after break")
    dropped = await h.forever()
    await dropped.__anext__()
    del dropped  # garbage: the stream closes itself
    await wait_until(lambda: _fin(h, 2), timeout=30, what="closed when dropped")


async def _fin(h: object, n: int) -> bool:
    return (await _stats(h))[1] == n


async def test_errors_arrive_after_the_items_before_them(local_cluster: Cluster) -> None:
    h = await local_cluster.spawn(Streamer)
    got = []
    with pytest.raises(ValueError, match="bad item 3") as info:
        async for x in await h.fails_after(3):
            got.append(x)
    assert got == [0, 1, 2] and isinstance(info.value, RemoteError)
    with pytest.raises(RuntimeError, match="generator raised StopIteration"):
        async for _ in await h.leaks_stop_iteration():
            pass
    assert await h.plain() == "plain"


async def test_a_caller_that_dies_closes_its_streams(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(local_cluster.token + "\n")
    token.chmod(0o600)
    h = await local_cluster.spawn(Streamer, name="streamer-orphan")
    await h.reset()
    code = textwrap.dedent(
        """
        import asyncio, os, sys
        from rayless import actors

        async def main():
            cluster = await actors.connect(sys.argv[1], token=open(sys.argv[2]).read().strip())
            h = await cluster.get_actor("streamer-orphan")
            stream = await h.forever()
            await stream.__anext__()
            print("reading", flush=True)
            os._exit(0)

        asyncio.run(main())
        """
    )
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", code, local_cluster.address, str(token)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "reading" in out.stdout, out.stderr
    await wait_until(lambda: _fin(h, 1), timeout=60, what="the dead caller's stream closed")


def test_the_blocking_face_iterates() -> None:
    with Cluster.local_sync(nodes=1) as cluster:
        h = cluster.spawn(Streamer)
        assert list(h.count.call(4)) == [0, 1, 2, 3]
        stream = h.forever.call()
        assert next(stream) == 1
        stream.close()

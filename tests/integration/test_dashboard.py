"""``rayless dashboard`` in a real browser: Debian's chromium driven headless by playwright.

The test starts a cluster with actors and a store, runs the command as its own process,
opens the page and checks that the actor table and a partition row appear and update after a
put; it takes a screenshot (``RAYLESS_UPDATE_SCREENSHOTS=1`` writes it to docs/ as well).
Without chromium, playwright or aiohttp it skips, saying which is missing.
"""

from __future__ import annotations

import asyncio
import os
import queue
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.actors.core import timeline
from rayless.store import Store
from tests.environ import without_rayless
from tests.integration.test_prometheus import strict_check
from tests.integration.timeline_classes import Peer
from tests.waiting import wait_until, wait_until_sync

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _missing() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"no {CHROMIUM} (apt-get install chromium; .ci/run does)"
    for module in ("playwright", "aiohttp"):
        try:
            __import__(module)
        except ImportError:
            return f"python package {module} is not installed (pip install -e '.[test]')"
    return None


@pytest.fixture
async def cluster(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    """A 2-node cluster recording its timeline; skips first, naming what is missing, without
    chromium, playwright or aiohttp."""
    missing = _missing()
    if missing:
        pytest.skip(missing)
    monkeypatch.setenv(timeline.ENV, "1")  # the page's timeline has spans to show
    timeline.RECORDER.reset()
    async with Cluster.local(nodes=2, gpus_per_node=2) as c:
        yield c
    monkeypatch.delenv(timeline.ENV)
    timeline.RECORDER.reset()


@pytest.fixture
def dashboard(cluster: Cluster, tmp_path: Path) -> Iterator[str]:
    """``rayless dashboard --port 0`` as a process of its own; its URL (with the key)."""
    token = tmp_path / "token"
    token.write_text(cluster.info.token + "\n")
    token.chmod(0o600)
    clean = without_rayless()
    cmd = [sys.executable, "-m", "rayless.cli", "dashboard", "--port", "0"]
    cmd += ["--address", cluster.address, "--token-file", str(token)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean
    )
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True)  # type: ignore[union-attr]
    reader.start()
    seen: list[str] = []

    def url() -> str | None:
        while not lines.empty():
            seen.append(lines.get())
        found = [
            ln.split(": ", 1)[1].strip() for ln in seen if ln.startswith("rayless dashboard: http")
        ]
        assert proc.poll() is None or found, "".join(seen)
        return found[0] if found else None

    try:
        yield wait_until_sync(url, timeout=60, what="the dashboard's URL on its stdout")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        reader.join(timeout=10)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.slow
async def test_dashboard_page_shows_actors_and_partitions_live(
    cluster: Cluster, dashboard: str, tmp_path: Path
) -> None:
    from playwright.async_api import async_playwright

    peer = await cluster.spawn(Peer, name="dash-peer", node="node-1", gpus=1)
    other = await cluster.spawn(Peer, name="dash-other", node="node-0")
    await peer.ping(other, 5)
    store = await Store.create(cluster, num_units=2, name="dash-store")
    try:
        await store.put(TensorDict({"x": torch.arange(4)}, [4]), partition="train")
        base = dashboard.split("?")[0]
        assert (await asyncio.to_thread(_get, base + "metrics"))[0] == 403  # no key: nothing
        status, text = await asyncio.to_thread(_get, dashboard.replace("/?", "/metrics?"))
        assert status == 200
        assert 'rayless_actor_calls_total{actor="dash-other",node="node-0",method="pong"} 5' in text
        strict_check(text)
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=CHROMIUM,
                args=["--headless", "--no-sandbox", "--disable-background-networking"],
            )
            try:
                page = await browser.new_page(viewport={"width": 1180, "height": 760})
                await page.goto(dashboard)
                await page.wait_for_selector(
                    '#actors-table tr[data-id="dash-peer"]', timeout=60_000
                )
                row = await page.inner_text('#actors-table tr[data-id="dash-peer"]')
                assert "Peer" in row and "alive" in row and "node-1" in row
                await page.wait_for_selector(
                    '#partitions-table tr[data-id="dash-store/train"]', timeout=60_000
                )

                async def samples(partition: str) -> str | None:
                    sel = f'#partitions-table tr[data-id="dash-store/{partition}"] td:nth-child(3)'
                    el = await page.query_selector(sel)
                    return None if el is None else await el.inner_text()

                assert await samples("train") == "4"
                fields = '#partitions-table tr[data-id="dash-store/train"] td:nth-child(4)'
                assert await page.inner_text(fields) == "x:4"  # samples holding each field
                await store.put(TensorDict({"x": torch.arange(6)}, [6]), partition="train")
                await store.put(TensorDict({"x": torch.arange(2)}, [2]), partition="eval")
                await wait_until(
                    lambda: samples("eval"), timeout=60, what="the new partition's row"
                )
                await wait_until(
                    lambda: _is(samples("train"), "10"),
                    timeout=60,
                    what="train's samples to update",
                )
                nodes = await page.inner_text("#nodes-table")
                assert "node-0" in nodes and "node-1" in nodes
                shot = tmp_path / "dashboard.png"
                await page.screenshot(path=str(shot))
                assert shot.stat().st_size > 1000
                if os.environ.get("RAYLESS_UPDATE_SCREENSHOTS") == "1":
                    shutil.copy(shot, DOCS / "dashboard.png")
            finally:
                await browser.close()
    finally:
        await store.shutdown()


async def _is(value: Any, expected: str) -> bool:
    return (await value) == expected

"""Fork templates shared by the local clusters of one process (``actors.launch.templates``):
later clusters fork from the templates the first one started, every actor gets its own
cluster's environment, a template never imports a module of the user's tree, and the
templates end with their process. The pools here import torch on demand only (the tests
need no torch, and each pool would import it again)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from rayless.actors import Cluster, Template
from rayless.actors.api.cluster import _start_local
from rayless.actors.host.zygote import installed
from rayless.actors.launch.local import LocalProcesses
from rayless.actors.launch.templates import TemplatePool
from tests.integration.template_classes import EnvProbe
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def local(pool: TemplatePool | None) -> AsyncIterator[tuple[Cluster, LocalProcesses]]:
    """A one-node cluster leasing its templates from ``pool`` (None: templates of its own)."""
    procs = LocalProcesses(nodes=1, template_pool=pool)
    cluster = await _start_local(procs)
    try:
        yield cluster, procs
    finally:
        await cluster.aclose()


def _templates(procs: LocalProcesses) -> list[int]:
    assert procs.zygote_proc is not None and procs.light_zygote_proc is not None
    return [procs.zygote_proc.pid, procs.light_zygote_proc.pid]


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _gone(pids: list[int], what: str) -> None:
    await wait_until(lambda: not any(map(_running, pids)), timeout=15, what=what)


async def test_clusters_one_after_another_fork_from_the_same_templates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = TemplatePool(preload="demand")
    try:
        monkeypatch.setenv("RAYLESS_TEST_FIRST", "1")
        async with local(pool) as (cluster, procs):
            first = _templates(procs)
            actor = await cluster.spawn(EnvProbe, cpus=0)
            assert await actor.parent() == first[0]  # forked by the shared torch template
            assert await actor.env("RAYLESS_TEST_FIRST") == "1"
            gone = [await actor.pid()]
        await _gone(gone, "the first cluster's actor to end with it")
        assert all(map(_running, first)), "a stopped cluster stopped the shared templates"
        assert psutil.Process(first[0]).children() == []
        # the environment of the next cluster, not the one the templates started with
        monkeypatch.delenv("RAYLESS_TEST_FIRST")
        monkeypatch.setenv("RAYLESS_TEST_SECOND", "2")
        async with local(pool) as (cluster, procs):
            assert _templates(procs) == first
            actor = await cluster.spawn(EnvProbe, cpus=0)
            light = await cluster.spawn(EnvProbe, cpus=0, template=Template.LIGHT)
            assert await actor.parent() == first[0] and await light.parent() == first[1]
            assert await actor.env("RAYLESS_TEST_FIRST") is None
            assert await actor.env("RAYLESS_TEST_SECOND") == "2"
            assert await light.env("RAYLESS_TEST_SECOND") == "2"
            assert not await light.torch_loaded()
    finally:
        pool.close()
    await _gone(first, "the pool's templates to stop when it closes")


async def test_a_shared_template_never_imports_a_module_of_the_users_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A template of the cluster's own imports the actor's module ahead (its children share
    it); a shared one does not (the file may change before the next cluster): the actor
    imports it. Both actors run."""
    record = tmp_path / "imported-by.txt"
    (tmp_path / "rayless_user_tree_mod.py").write_text(
        textwrap.dedent(f"""
        import os
        from rayless.actors import Actor

        with open({str(record)!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")

        class Mine(Actor):
            def pid(self) -> int:
                return os.getpid()
        """)
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the templates can import it too
    monkeypatch.syspath_prepend(str(tmp_path))
    import rayless_user_tree_mod  # type: ignore[import-not-found]

    for pool in (TemplatePool(preload="demand"), None):
        record.write_text("")
        try:
            async with local(pool) as (cluster, procs):
                actor = await cluster.spawn(rayless_user_tree_mod.Mine, cpus=0)
                pid = await actor.pid()
                template = _templates(procs)[0]
        finally:
            if pool is not None:
                pool.close()
        importers = {int(line) for line in record.read_text().split()}
        assert importers == ({pid} if pool is not None else {template})


async def test_a_cluster_started_elsewhere_gets_templates_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The templates' import path depends on the working directory: another one gets other
    templates, and the idle ones of the first are stopped."""
    pool = TemplatePool(preload="demand")
    try:
        async with local(pool) as (_, procs):
            first = _templates(procs)
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # (for tests.*)
        async with local(pool) as (cluster, procs):
            second = _templates(procs)
            assert set(first).isdisjoint(second)
            actor = await cluster.spawn(EnvProbe, cpus=0)
            assert await actor.parent() == second[0]
        await _gone(first, "the idle templates of the other directory to stop")
    finally:
        pool.close()


async def test_a_template_that_died_is_started_again() -> None:
    pool = TemplatePool(preload="demand")
    try:
        async with local(pool) as (_, procs):
            first = _templates(procs)
        os.kill(first[0], signal.SIGKILL)
        await _gone(first[:1], "the killed template")
        async with local(pool) as (cluster, procs):
            torch_template, light_template = _templates(procs)
            assert torch_template != first[0] and light_template == first[1]
            actor = await cluster.spawn(EnvProbe, cpus=0)
            assert await actor.parent() == torch_template
    finally:
        pool.close()


async def test_a_mode_given_to_cluster_local_gets_templates_of_its_own() -> None:
    async with Cluster.local(nodes=1, zygote_preload="demand") as cluster:
        local = cluster._local
        assert local is not None and local.template_pool is None and not local.leases


DRIVER = """
import sys, time
import rayless.actors as actors
from rayless.actors.launch import templates

templates.share()
templates.pool().preload = "demand"  # (this test needs no torch in the templates)
seen = set()
for _ in range(2):
    with actors.Cluster.local_sync(nodes=1) as cluster:
        seen.add(cluster.spawn(Probe, cpus=0).parent.call())
pool = templates.pool()
print(len(seen), *pool.pids(), flush=True)
if sys.argv[1] == "wait":
    time.sleep(300)
"""


@pytest.mark.parametrize("end", ["exit", "SIGKILL"])
async def test_shared_templates_end_with_their_process(end: str, tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text("from tests.integration.template_classes import EnvProbe as Probe\n" + DRIVER)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, str(script), "wait" if end == "SIGKILL" else "exit"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120)
        forked_by, *pids = map(int, line.split())
        assert forked_by == 1 and len(pids) == 2  # both clusters forked from one template
        if end == "SIGKILL":
            proc.kill()
        await asyncio.to_thread(proc.wait, 60)
        await _gone(pids, f"the shared templates to end with their process ({end})")
    finally:
        proc.kill()
        proc.wait()


def test_installed_tells_packages_from_the_users_tree(tmp_path: Path) -> None:
    (tmp_path / "rayless_probe_tree.py").write_text("")
    assert installed("json") and installed("os.path") and installed("sys")
    assert installed("torch") and installed("tensordict.nn") and installed("rayless.actors")
    assert not installed("tests.integration.template_classes")  # this source tree
    assert not installed("rayless_no_such_module_anywhere")
    sys.path.insert(0, str(tmp_path))
    try:
        assert not installed("rayless_probe_tree")
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("shared", [True, False])
async def test_a_failed_preload_leaves_no_package_that_shadows_the_actors(
    shared: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template's import path finds another project's package of the same name first
    (as another project's ``tests`` in site-packages): its preload of the actor's module
    fails, and the half-imported package must not stay in the template for the actor."""
    decoy, real = tmp_path / "decoy", tmp_path / "real"
    for root in (decoy, real):
        (root / "rayless_twin_pkg").mkdir(parents=True)
        (root / "rayless_twin_pkg" / "__init__.py").write_text("")
    (real / "rayless_twin_pkg" / "mine.py").write_text(
        "from rayless.actors import Actor\n\nclass Mine(Actor):\n    def ok(self) -> bool:\n"
        "        return True\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(decoy))  # the templates' path
    monkeypatch.syspath_prepend(str(real))  # the driver's (and so its actors')
    from rayless_twin_pkg.mine import Mine  # type: ignore[import-not-found]

    pool = TemplatePool(preload="demand") if shared else None
    try:
        async with local(pool) as (cluster, _):
            actor = await cluster.spawn(Mine, cpus=0)
            assert await actor.ok()
    finally:
        if pool is not None:
            pool.close()

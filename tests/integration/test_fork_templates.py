"""Two fork templates per host: user actors fork from the torch template (torch imported
ahead), actors that ask for ``Template.LIGHT`` (the store's controller) from the light one,
which never imports torch; a light actor that imports torch still works."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psutil
import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster, Template
from rayless.store import Store
from tests.integration.template_classes import BadImports, Probe, TorchProbe

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    """A one-node cluster of this test's own (its templates' children are this test's)."""
    async with Cluster.local(nodes=1, zygote_preload="eager") as c:
        yield c


def _maps_torch(proc: psutil.Process) -> bool:
    with open(f"/proc/{proc.pid}/maps") as f:
        return "libtorch" in f.read()


def _children(pid: int | None) -> list[psutil.Process]:
    assert pid is not None
    return sorted(psutil.Process(pid).children(), key=lambda p: (p.create_time(), p.pid))


async def test_user_actors_get_torch_and_light_actors_do_not(cluster: Cluster) -> None:
    heavy = await cluster.spawn(Probe, cpus=0)
    light = await cluster.spawn(Probe, cpus=0, template=Template.LIGHT)
    assert await heavy.torch_loaded(), "a default actor did not fork from the torch template"
    assert not await light.torch_loaded(), "a LIGHT actor has torch"
    assert await light.use_torch() == 3.0  # it imports torch itself: slower, still works
    assert await light.torch_loaded()
    by_value = await cluster.spawn(Probe, cpus=0, template="light")  # the Enum's value
    assert not await by_value.torch_loaded()


async def test_a_template_that_is_not_one_is_refused(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="template must be a Template"):
        await cluster.spawn(Probe, cpus=0, template="heavy")


async def test_the_store_controller_starts_on_the_light_template_and_units_on_torchs(
    cluster: Cluster,
) -> None:
    local = cluster._local
    assert local is not None and local.light_zygote_proc is not None
    assert local.zygote_proc is not None
    store = await Store.create(cluster, num_units=2)
    try:
        await store.ready()  # create returns before the units serve
        light = _children(local.light_zygote_proc.pid)
        assert len(light) == 1, f"the light template forked {light}, not the store's controller"
        (controller,) = light
        assert not _maps_torch(controller), "the controller started with torch"
        units = _children(local.zygote_proc.pid)
        assert len(units) == 2 and all(_maps_torch(p) for p in units)  # torch's pages shared
        td = TensorDict({"x": torch.arange(16.0).view(8, 2)}, batch_size=[8])
        meta = await store.put(td, partition="p")
        got = await store.get(meta)
        assert torch.equal(got["x"], td["x"])
        assert not _maps_torch(controller), "the controller imported torch"
    finally:
        await store.aclose()


async def test_a_template_on_demand_imports_torch_only_for_actors_that_ask() -> None:
    """``zygote_preload="demand"``: an actor whose module does not import torch forks without
    it; a class's ``template_imports`` has the template import torch before forking it, and
    the store's units (which declare theirs) fork with torch in."""
    async with Cluster.local(nodes=1, zygote_preload="demand") as cluster:
        local = cluster._local
        assert local is not None and local.zygote_proc is not None
        template = psutil.Process(local.zygote_proc.pid)
        plain = await cluster.spawn(Probe, cpus=0)
        assert not await plain.torch_loaded(), "a torch-free actor forked with torch"
        assert not _maps_torch(template)
        store = await Store.create(cluster, num_units=1)  # StorageUnit.template_imports
        try:
            await store.ready()
            assert _maps_torch(template), "the unit's template_imports did not reach the template"
            (unit,) = _children(local.zygote_proc.pid)[1:]
            assert _maps_torch(unit)
        finally:
            await store.aclose()
        heavy = await cluster.spawn(TorchProbe, cpus=0)
        assert await heavy.torch_loaded()


async def test_template_imports_that_are_not_a_tuple_of_names_are_refused(
    cluster: Cluster,
) -> None:
    with pytest.raises(TypeError, match="template_imports must be a tuple of module names"):
        await cluster.spawn(BadImports, cpus=0)

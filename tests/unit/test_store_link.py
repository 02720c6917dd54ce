"""StoreLink alone (a fake controller): the unit table and the start, meta checks, and
per-unit calls that report a dead unit to the controller."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from rayless.actors import ActorDiedError
from rayless.store.client.link import StoreLink, shard_groups
from rayless.store.data.messages import UnitView
from rayless.store.data.meta import BatchMeta
from rayless.store.errors import ForeignMetaError, StoreError, StoreInputError, UnitLostError
from rayless.transport.errors import ClosedError


class _Controller:
    """Records the unit losses it is told of."""

    def __init__(self) -> None:
        self.lost: list[str] = []

    async def unit_lost(self, unit_id: str, reason: str) -> None:
        self.lost.append(unit_id)


def _link() -> tuple[_Controller, StoreLink]:
    ctl = _Controller()
    units = [UnitView("u0", 0), UnitView("u1", 1)]
    return ctl, StoreLink(ctl, units, "s")  # type: ignore[arg-type]


def _meta(shards: tuple[int, ...], parts: tuple[str, ...] | None = None) -> BatchMeta:
    n = len(shards)
    return BatchMeta("s", tuple(range(n)), parts or ("p",) * n, shards, (1,) * n, {})


def test_samples_group_by_shard_and_partition_in_first_seen_order() -> None:
    assert shard_groups(_meta((1, 0, 1))) == {(1, "p"): [0, 2], (0, "p"): [1]}
    assert shard_groups(_meta((0, 0))) == {(0, "p"): [0, 1]}
    assert shard_groups(_meta((0, 0, 1), ("a", "b", "a"))) == {
        (0, "a"): [0],
        (0, "b"): [1],
        (1, "a"): [2],
    }


async def test_the_table_waits_for_the_start_and_raises_its_error_once_seen() -> None:
    _, link = _link()
    start: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    link.start = start
    with pytest.raises(StoreError, match="still starting"):
        link.table  # noqa: B018
    start.set_exception(RuntimeError("no node"))
    with pytest.raises(RuntimeError, match="no node"):
        link.table  # noqa: B018
    assert link.start_seen
    ok: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    ok.set_result(None)
    link.start = ok
    assert [u.unit_id for u in link.table] == ["u0", "u1"] and link.start is None
    link.closed = True
    with pytest.raises(ClosedError):
        link.controller  # noqa: B018
    with pytest.raises(ClosedError):
        link.table  # noqa: B018


def test_a_meta_is_checked_against_the_store_and_its_table() -> None:
    _, link = _link()
    meta = _meta((0, 1))
    assert link.check_meta(meta) is meta
    with pytest.raises(StoreInputError, match="expected a BatchMeta"):
        link.check_meta({"not": "a meta"})
    with pytest.raises(ForeignMetaError):
        link.check_meta(dataclasses.replace(meta, store_id="other"))
    with pytest.raises(StoreInputError, match="names shard 2"):
        link.check_meta(_meta((0, 2)))


async def test_per_unit_calls_raise_the_first_error_and_report_a_dead_unit() -> None:
    ctl, link = _link()

    async def value(v: Any) -> Any:
        return v

    async def died() -> None:
        raise ActorDiedError("u1", reason="killed")

    assert await link.gather([0, 1], [value(1), value(2)]) == [1, 2]
    with pytest.raises(UnitLostError) as err:
        await link.gather([0, 1], [value(1), died()])
    assert err.value.unit == "u1" and ctl.lost == ["u1"]

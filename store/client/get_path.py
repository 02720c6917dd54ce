"""GetPath: a Store's fetches of metas and reads of data.

``get_meta`` asks the controller for a BatchMeta (waiting fetches, samplers); a fetch is
acknowledged once served, or cancelled when its caller gives up (one-way notes, kept alive
until sent). A get reads only the units holding the meta's samples, in parallel (same-host
units through :class:`~rayless.store.samehost.plane.LocalPlane`), while the controller checks
the meta, then merges in order and moves the fields to their device; samples lost with a unit
make it a PartialResultError (:mod:`rayless.store.data.partial`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from tensordict import TensorDict

from rayless.actors import ActorDiedError
from rayless.store.client.link import StoreLink, shard_groups
from rayless.store.controller.fetches import check_timeout
from rayless.store.controller.samplers import sampler_ref
from rayless.store.data.messages import FetchMode
from rayless.store.data.meta import BatchMeta
from rayless.store.data.partial import partial_result
from rayless.store.data.requests import FetchRequest
from rayless.store.data.rows import merge, place
from rayless.store.errors import (
    StoreInputError,
    UnitLostError,
    UnknownFieldError,
    UnknownPartitionError,
)
from rayless.store.samehost.plane import LocalPlane

__all__ = ["GetPath"]


def _sampler_spec(sampler: Any) -> Any:
    """What travels for ``sampler``: a spec as it is, a Sampler's own spec, a sampler class
    by reference (``"package.module:Class"``, built with no arguments where it runs)."""
    if sampler is None or isinstance(sampler, (str, Mapping)):
        return sampler
    if isinstance(sampler, type):
        return {"name": sampler_ref(sampler)}
    spec = getattr(sampler, "spec", None)
    if callable(spec):
        return spec()
    raise StoreInputError(f"not a sampler or sampler spec: {sampler!r}")


async def _done(value: Any) -> Any:
    if isinstance(value, BaseException):
        raise value
    return value


class GetPath:
    """The get path of one Store client: its link to the actors, its same-host data plane,
    and the one-way notes (acks, cancels) it keeps alive until sent."""

    def __init__(self, link: StoreLink, plane: LocalPlane) -> None:
        self._link = link
        self._plane = plane
        self._notes: set[asyncio.Future[Any]] = set()  # acks and cancels in flight

    async def get_meta(
        self,
        partition: str,
        fields: Sequence[str],
        batch_size: int | None = None,
        *,
        task: str = "default",
        mode: FetchMode | str = FetchMode.FETCH,
        sampler: Any = None,
        timeout: float | None = None,
        share: tuple[str, int] | tuple[str, int, bool] | None = None,
    ) -> BatchMeta:
        """Ready samples of ``partition`` holding ``fields``, unconsumed by ``task``; see
        :meth:`Store.get_meta` (its arguments, what it returns and raises)."""
        check_timeout(timeout)
        mode = FetchMode.of(mode)
        request = FetchRequest(
            partition, tuple(fields), batch_size, task, mode, _sampler_spec(sampler), timeout
        )
        if share is not None:
            return await self._link.controller.get_meta(request, None, list(share))
        fetch_id = uuid.uuid4().hex
        try:
            meta: BatchMeta = await self._link.controller.get_meta(request, fetch_id)
        except asyncio.CancelledError:
            self.note(self._link.handle.cancel_fetch(fetch_id))
            raise
        if mode is FetchMode.FETCH:
            self.note(self._link.handle.ack_fetch(fetch_id))
        return meta

    def note(self, future: asyncio.Future[Any]) -> None:
        """Keep a one-way note (ack, cancel) alive until sent; its errors do not matter."""
        self._notes.add(future)

        def done(f: asyncio.Future[Any]) -> None:
            self._notes.discard(f)
            if not f.cancelled():
                f.exception()

        future.add_done_callback(done)

    async def get(
        self,
        meta: BatchMeta,
        fields: Sequence[str] | None = None,
        *,
        device: Any = None,
        zero_copy: bool = False,
    ) -> TensorDict:
        """The data of ``meta``'s samples (``fields``: a subset) as one TensorDict; see
        :meth:`Store.get` (its arguments, what it returns and raises)."""
        meta = self._link.check_meta(meta)
        if fields is not None:
            meta = meta.select_fields(fields)
        names = meta.field_names
        if meta.size == 0 or not names:
            await self._link.controller.check_readable(meta)
            return TensorDict({}, batch_size=[meta.size])
        groups = shard_groups(meta)
        local = await self._plane.get(
            self._link.controller, self._link.table, meta, names, groups, zero_copy, device
        )
        if local is not None:
            return place(local, meta.field_schemas, device)
        calls = [self._link.controller.lost_positions(meta)]
        for (shard, part), positions in groups.items():
            indexes = [meta.global_indexes[p] for p in positions]
            calls.append(self._link.table[shard].handle.read(part, indexes, names))
        results = await asyncio.gather(*calls, return_exceptions=True)
        if isinstance(results[0], BaseException):
            raise results[0]
        if any(isinstance(r, (UnknownFieldError, UnknownPartitionError)) for r in results[1:]):
            # cleared meanwhile: StaleMetaError (lost samples are the partial result's below)
            await self._link.controller.lost_positions(meta)
        lost: dict[int, str] = dict(results[0])
        dead = [isinstance(r, (ActorDiedError, UnitLostError)) for r in results[1:]]
        if lost or any(dead):
            await partial_result(self._link, meta, groups, results[1:], lost, device)
        results = await self._link.gather(
            [shard for shard, _ in groups], [_done(r) for r in results[1:]]
        )
        parts = [(pos, td) for pos, td in zip(groups.values(), results, strict=True)]
        return place(merge(meta.size, meta.field_schemas, parts), meta.field_schemas, device)

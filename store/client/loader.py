"""A streaming data loader: a trainer's batches straight from a partition, rank-aware.

    loader = StreamingLoader(store, "train", ["input_ids", "mask"], batch_size=8,
                             task="actor_update", dp_rank=r, dp_size=4, replicas=2)
    async for td, meta in loader: ...             # an asyncio trainer
    for td, meta in StreamingDataset(sync_store, ...): ...   # a torch IterableDataset

Every rank of a data-parallel group (``dp_rank`` of ``dp_size``) asks for step ``k`` of the
same *global* batch (``batch_size * dp_size`` samples, fetched once with the sampler: the
controller's shared fetch ``share=(f"{task}#{k}", dp_size * replicas)``), then reads only its
part of it: disjoint parts for the ``dp_size`` ranks, the same part for the ``replicas``
ranks of one tensor/sequence-parallel group (pass the same ``dp_rank`` on each). The parts
are contiguous, or balanced in total tokens with a
:class:`~rayless.store.controller.samplers.SeqlenBalancedSampler` (its ``dp_size`` must match);
every rank computes the same split. A step's batch stays assigned to it even if a rank's fetch is
cancelled or times out: asking again for the same step returns the same part, for as long
as the step is held (``lease_after`` seconds after its fetch), as TransferQueue's samplers
cache a step per rank. A rank that asks again (a restart, a second read) counts once: it
never takes another rank's part. ``replica_rank`` (0 to ``replicas - 1``) tells the replicas
of a group apart, so the step is done as soon as every one of them read it.

Each rank acknowledges its part once it has read it. When a rank dies (or never asks), the
parts nobody acknowledged within the store's ``lease_after`` seconds of the step's fetch go
back to the task, and the step is forgotten; a replacement rank (any ``start_step``) then
fetches new batches, which hold those samples. Delivery is at least once: a rank slower
than the lease may see its part again in a later batch.

An *epoch* is one iteration (``async for`` / ``for``): ``steps`` batches (None: endless), or
fewer when ``stop_when_consumed`` and the partition's samples are all consumed by the task
(TransferQueue's StreamingDataset loop). The next iteration is the next epoch: it goes on
with the next steps and new samples, it never replays a step (a fetched sample is consumed
once per task; ``reset_consumption`` makes samples fetchable again).
:meth:`StreamingDataset.set_epoch` picks the epoch explicitly (steps ``start_step + epoch *
steps`` on), as ``DistributedSampler.set_epoch`` does, which a ``DataLoader`` with workers
needs: its workers start from the dataset as it was when the iteration began.

``StreamingDataset`` yields :class:`Batch` items, which unpack as ``td, meta`` and which
torch's default collate (``DataLoader(ds, batch_size=None)``) passes through unchanged. In a
``DataLoader`` worker (``num_workers > 0``) the dataset opens its own store client in that
process, on its own event loop (the parent's client does not survive a fork; a spawned
worker, ``multiprocessing_context="spawn"``, gets the dataset pickled without it and joins
the cluster the parent's store is on: ``rayless.actors.ext.ChildJoin``), and worker ``w``
of ``W`` reads the steps ``w, w + W, ...`` of the epoch, so the DataLoader still yields
them in step order.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing.util
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from tensordict import TensorDict
from torch.utils.data import IterableDataset, get_worker_info

from rayless.actors import Cluster
from rayless.actors.ext import ChildJoin, Portal
from rayless.store.client.store import Store
from rayless.store.controller.samplers import make_sampler
from rayless.store.data.messages import FetchMode
from rayless.store.data.meta import BatchMeta
from rayless.store.data.requests import FetchRequest
from rayless.store.errors import PartialResultError, StoreInputError

__all__ = ["Batch", "StreamingDataset", "StreamingLoader", "rank_part"]

log = logging.getLogger(__name__)


def rank_part(meta: BatchMeta, sampler: Any, dp_rank: int, dp_size: int) -> list[int]:
    """The positions of ``meta`` that belong to ``dp_rank``: the sampler's ``split`` if it
    has one, else contiguous equal parts. Raises StoreInputError (not divisible)."""
    split = getattr(sampler, "split", None)
    if callable(split):
        if getattr(sampler, "dp_size", dp_size) != dp_size:
            raise StoreInputError(f"the sampler's dp_size differs from the loader's {dp_size}")
        parts: list[list[int]] = split(list(meta.custom_meta))
        return parts[dp_rank]
    if meta.size % dp_size:
        raise StoreInputError(f"a batch of {meta.size} does not split over {dp_size} ranks")
    per = meta.size // dp_size
    return list(range(dp_rank * per, (dp_rank + 1) * per))


class StreamingLoader:
    """An async iterator of ``(TensorDict, BatchMeta)``, one per training step, for this rank.

    Raises StoreInputError for bad ranks or sizes; a fetch that times out
    (``timeout`` seconds per step, None: wait) raises StoreTimeoutError from ``__anext__``.
    """

    def __init__(
        self,
        store: Store,
        partition: str,
        fields: Sequence[str],
        batch_size: int,
        *,
        task: str = "default",
        dp_rank: int = 0,
        dp_size: int = 1,
        replicas: int = 1,
        replica_rank: int = 0,
        sampler: Any = None,
        steps: int | None = None,
        start_step: int = 0,
        timeout: float | None = None,
        device: Any = None,
        stop_when_consumed: bool = False,
    ) -> None:
        for name, v, low in (
            ("batch_size", batch_size, 1),
            ("dp_size", dp_size, 1),
            ("replicas", replicas, 1),
            ("start_step", start_step, 0),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise StoreInputError(f"{name} must be an int >= {low}, got {v!r}")
        if not isinstance(dp_rank, int) or not 0 <= dp_rank < dp_size:
            raise StoreInputError(f"dp_rank must be in [0, {dp_size}), got {dp_rank!r}")
        if not isinstance(replica_rank, int) or not 0 <= replica_rank < replicas:
            raise StoreInputError(f"replica_rank must be in [0, {replicas}), got {replica_rank!r}")
        if steps is not None and (not isinstance(steps, int) or steps < 0):
            raise StoreInputError(f"steps must be None or an int >= 0, got {steps!r}")
        self.store = store
        self.partition = partition
        self.fields = list(fields)
        self.batch_size = batch_size
        self.task = task
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.replicas = replicas
        self.replica_rank = replica_rank
        self.consumer = f"{dp_rank}.{replica_rank}"  # who acknowledges a step's part
        self.sampler = make_sampler(sampler) if sampler is not None else None
        self._spec = None if self.sampler is None else self.sampler.spec()
        self.steps = steps
        self.start_step = start_step
        self.step = start_step
        self.end: int | None = None if steps is None else start_step + steps  # the epoch's end
        self.timeout = timeout
        self.device = device
        self.stop_when_consumed = stop_when_consumed
        self._unacked: dict[int, tuple[str, list[int]]] = {}  # step -> (fetch id, positions)

    def __getstate__(self) -> dict[str, Any]:
        """A pickled loader (in a spawned DataLoader worker's dataset) carries its arguments
        and position, not this process's store client."""
        state = dict(self.__dict__)
        state["store"], state["_unacked"] = None, {}
        return state

    def __aiter__(self) -> StreamingLoader:
        """Begin an epoch (see the module docstring); an unfinished one goes on."""
        if self.end is not None and self.steps is not None and self.step >= self.end:
            self.end = self.step + self.steps
        return self

    async def __anext__(self) -> tuple[TensorDict, BatchMeta]:
        if self.end is not None and self.step >= self.end:
            raise StopAsyncIteration
        if self.stop_when_consumed and self.partition in await self.store.partitions():
            status = await self.store.consumption_status(self.partition, self.task)
            if status["samples"] and status["consumed"] >= status["samples"]:
                raise StopAsyncIteration
        step = self.step
        meta = await self.fetch(step)
        self.step += 1
        try:
            td = await self.store.get(meta, device=self.device)
        except PartialResultError:
            self.ack(step)  # its live part is in the error: read, as far as it goes
            raise
        self.ack(step)
        return td, meta

    async def fetch(self, step: int) -> BatchMeta:
        """This rank's meta for ``step`` (the same on every call for that step while the
        step's batch is held). Its part is leased until :meth:`ack`: unacknowledged, it goes
        back to the task ``lease_after`` s after the step's fetch. Raises StoreTimeoutError,
        StoreInputError."""
        await self.store.ready(self.timeout or None)  # units still starting: wait for them
        fetch_id = uuid.uuid4().hex
        controller = self.store.controller
        try:
            request = FetchRequest(
                self.partition,
                tuple(self.fields),
                self.batch_size * self.dp_size,
                self.task,
                FetchMode.FETCH,
                self._spec,
                self.timeout,
            )
            share = [f"{self.task}#{step}", self.dp_size * self.replicas]
            whole: BatchMeta = await controller.get_meta(request, fetch_id, share)
        except asyncio.CancelledError:
            self.store._note(controller.cancel_fetch(fetch_id))
            raise
        positions = rank_part(whole, self.sampler, self.dp_rank, self.dp_size)
        self._unacked[step] = (fetch_id, positions)
        return whole.select(positions)

    def ack(self, step: int) -> None:
        """Tell the store this rank read its part of ``step`` (fetched with :meth:`fetch`):
        it stays consumed. A step not fetched (or acknowledged already) is ignored."""
        got = self._unacked.pop(step, None)
        if got is not None:
            controller = self.store.controller
            self.store._note(controller.ack_fetch(got[0], got[1], self.consumer))


class Batch:
    """One step of a :class:`StreamingDataset`: ``td`` (a TensorDict) and ``meta`` (its
    BatchMeta). Unpacks as ``td, meta`` (and ``batch[0]``, ``batch[1]``); it is neither a
    tuple nor a mapping, so torch's default collate hands it on unchanged."""

    __slots__ = ("meta", "td")

    def __init__(self, td: TensorDict, meta: BatchMeta) -> None:
        self.td = td
        self.meta = meta

    def __iter__(self) -> Iterator[Any]:
        return iter((self.td, self.meta))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> Any:
        return (self.td, self.meta)[i]

    def pin_memory(self) -> Batch:
        """This batch with its TensorDict in pinned memory (``DataLoader(pin_memory=True)``)."""
        return Batch(self.td.pin_memory(), self.meta)


class StreamingDataset(IterableDataset[Batch]):
    """A torch ``IterableDataset`` over a :class:`StreamingLoader`, for plain threaded
    trainers: give it a ``SyncStore`` and the loader's arguments, and use it as
    ``DataLoader(ds, batch_size=None, num_workers=...)`` (it yields whole batches as
    :class:`Batch` items). See the module docstring for epochs and workers. Raises
    StoreInputError for bad loader arguments, StoreTimeoutError from iteration when a step
    is not ready within ``timeout``."""

    def __init__(self, store: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.sync_store = store
        self.loader = StreamingLoader(store.store, *args, **kwargs)
        self.store_name = store.controller.name
        self.epoch: int | None = None  # set_epoch's, else the loader goes on where it was
        self._worker: tuple[Portal, StreamingLoader] | None = None  # in a DataLoader worker
        self._base: int | None = None  # the worker's current epoch's first step

    def __getstate__(self) -> dict[str, Any]:
        """What a spawned DataLoader worker gets: the loader's arguments, the store's name
        and how to join its cluster (a ``ChildJoin``), none of this process's clients."""
        state = dict(self.__dict__)
        state["sync_store"], state["_worker"] = None, None
        cluster = self.sync_store.store.cluster if self.sync_store is not None else None
        if cluster is not None:
            state["_join"] = ChildJoin.of(cluster)
        return state

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch``: steps ``start_step + epoch * steps`` on.
        Raises StoreInputError for a negative epoch or a loader without ``steps``."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise StoreInputError(f"epoch must be an int >= 0, got {epoch!r}")
        if self.loader.steps is None:
            raise StoreInputError("set_epoch needs a loader with steps (an endless one has one)")
        self.epoch = epoch

    def _epoch_range(self, loader: StreamingLoader) -> None:
        if self.epoch is not None and loader.steps is not None:
            loader.step = loader.start_step + self.epoch * loader.steps
            loader.end = loader.step + loader.steps
            self.epoch = None
        else:
            loader.__aiter__()

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        if info is None:
            self._epoch_range(self.loader)
            yield from self._steps(lambda aw: self.sync_store.run(aw, None), self.loader, 1)
            return
        portal, loader = self._worker_loader()
        steps, first = loader.steps, self._base is None
        if self.epoch is not None and steps is not None:
            base: int | None = loader.start_step + self.epoch * steps
        elif first:
            base = loader.step
        elif steps is not None and self._base is not None:
            base = self._base + steps  # a persistent worker's next epoch
        else:
            base = None  # an endless loader goes on
        if base is not None:
            if not (first and loader.end is not None and base < loader.end):
                loader.end = None if steps is None else base + steps
            loader.step, self._base = base + info.id, base
        yield from self._steps(lambda aw: portal.run(aw, None), loader, info.num_workers)

    def _worker_loader(self) -> tuple[Portal, StreamingLoader]:
        """This worker process's own client and loader (opened once; closed at its exit)."""
        if self._worker is None:
            portal = Portal("rayless-loader-worker")
            store, cluster = portal.run(
                open_in_worker(self.store_name, getattr(self, "_join", None))
            )
            mine = self.loader
            loader = StreamingLoader(
                store, mine.partition, mine.fields, mine.batch_size, task=mine.task,
                dp_rank=mine.dp_rank, dp_size=mine.dp_size, replicas=mine.replicas,
                replica_rank=mine.replica_rank, sampler=mine.sampler, steps=mine.steps,
                start_step=mine.start_step, timeout=mine.timeout, device=mine.device,
                stop_when_consumed=mine.stop_when_consumed,
            )  # fmt: skip
            loader.step, loader.end = mine.step, mine.end
            self._worker = (portal, loader)
            # run by the worker process's exit (multiprocessing's, not atexit: it os._exit()s)
            multiprocessing.util.Finalize(
                self, close_in_worker, (portal, store, cluster), exitpriority=10
            )
        return self._worker

    @staticmethod
    def _steps(run: Any, loader: StreamingLoader, stride: int) -> Iterator[Batch]:
        while True:
            try:
                td, meta = run(loader.__anext__())
            except StopAsyncIteration:
                return
            yield Batch(td, meta)
            loader.step += stride - 1


async def open_in_worker(name: str, join: ChildJoin | None) -> tuple[Store, Cluster | None]:
    """A DataLoader worker's client of the store ``name``, and the cluster connection it
    opened for it: through the cluster ``join`` names (a spawned worker: its parent's), or
    the one ``connect()`` finds (a forked worker: None, the store's own). Close both with
    :func:`close_in_worker`."""
    if join is None:
        return await Store.connect(name), None
    cluster = await join.connect()
    try:
        return await Store.connect(name, cluster), cluster
    except BaseException:
        await cluster.aclose()
        raise


def close_in_worker(portal: Portal, store: Store, cluster: Cluster | None) -> None:
    """Close what :func:`open_in_worker` opened, then ``portal`` (a worker's exit handler:
    never raises)."""

    async def close() -> None:
        try:
            await store.aclose()
        finally:
            if cluster is not None:
                await cluster.aclose()

    try:
        portal.run(close(), 30)
    except Exception as exc:  # the cluster went away first: nothing left to close
        log.debug("closing a DataLoader worker's store client: %s", exc)
    finally:
        portal.stop()

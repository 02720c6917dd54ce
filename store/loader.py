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
:class:`~rayless.store.samplers.SeqlenBalancedSampler` (its ``dp_size`` must match); every
rank computes the same split. A step's batch stays assigned to it even if a rank's fetch is
cancelled or times out: asking again for the same step returns the same batch.

Each rank acknowledges its part once it has read it. When a rank dies (or never asks), the
parts nobody acknowledged within the store's ``lease_after`` seconds of the step's fetch go
back to the task, and the step is forgotten; a replacement rank (any ``start_step``) then
fetches new batches, which hold those samples. Delivery is at least once: a rank slower
than the lease may see its part again in a later batch.

Iteration ends after ``steps`` batches (None: never), or when ``stop_when_consumed`` and the
partition's samples are all consumed by the task (TransferQueue's StreamingDataset loop).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from tensordict import TensorDict
from torch.utils.data import IterableDataset

from rayless.store.client import Store
from rayless.store.errors import PartialResultError, StoreInputError
from rayless.store.meta import BatchMeta
from rayless.store.samplers import make_sampler

__all__ = ["StreamingDataset", "StreamingLoader", "rank_part"]


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
        self.sampler = make_sampler(sampler) if sampler is not None else None
        self._spec = None if self.sampler is None else self.sampler.spec()
        self.steps = steps
        self.step = start_step
        self.timeout = timeout
        self.device = device
        self.stop_when_consumed = stop_when_consumed
        self._unacked: dict[int, tuple[str, list[int]]] = {}  # step -> (fetch id, positions)

    def __aiter__(self) -> StreamingLoader:
        return self

    async def __anext__(self) -> tuple[TensorDict, BatchMeta]:
        if self.steps is not None and self.step >= self.steps:
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
        fetch_id = uuid.uuid4().hex
        controller = self.store.controller
        try:
            whole: BatchMeta = await controller.get_meta(
                self.partition,
                self.fields,
                self.batch_size * self.dp_size,
                self.task,
                "fetch",
                self._spec,
                self.timeout,
                fetch_id,
                [f"{self.task}#{step}", self.dp_size * self.replicas],
            )
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
            self.store._note(self.store.controller.ack_fetch(got[0], got[1]))


class StreamingDataset(IterableDataset[tuple[TensorDict, BatchMeta]]):
    """A torch ``IterableDataset`` over a :class:`StreamingLoader`, for plain threaded
    trainers: give it a ``SyncStore`` (and the loader's arguments); use it with
    ``DataLoader(ds, batch_size=None)`` (it yields whole batches) and ``num_workers=0``
    (the store client lives in this process)."""

    def __init__(self, store: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.sync_store = store
        self.loader = StreamingLoader(store.store, *args, **kwargs)

    def __iter__(self) -> Iterator[tuple[TensorDict, BatchMeta]]:
        while True:
            try:
                item = self.sync_store._run(self.loader.__anext__(), None)
            except StopAsyncIteration:
                return
            yield item

"""TransferQueue's streaming loader (``StreamingDataset``, ``StreamingDataLoader``) on the
store of ``rayless.transfer_queue``.

    dataset = StreamingDataset(config, batch_size=8, micro_batch_size=2,
                               data_fields=["input_ids"], partition_id="train",
                               task_name="update_actor", dp_rank=dp_rank)
    for td, meta in StreamingDataLoader(dataset, num_workers=2):
        ...

Each batch of ``batch_size`` samples is fetched with ``sampling_config={"dp_rank": ...,
"batch_index": k}``: under ``RankAwareSampler`` every rank that passes the same ``dp_rank``
reads the same ``k``-th batch, and groups read disjoint ones. A fetched batch is kept in the
dataset's ``buffer`` until :meth:`StreamingDataset.step` moves it to another partition, and
cut into micro-batches of ``micro_batch_size`` (``process_batch_fn``). The iteration is
endless (``should_check_consumption_status=False``: it waits for new samples) or ends once
the task consumed every sample of the partition, the buffer was read out and the group holds
no batch this rank has not read (a rank behind its group's other ranks still reads the
group's last batch). ``reset()`` reads the buffer again from its first batch (another pass
over the same samples).

In a ``DataLoader`` worker (``num_workers`` W > 0) the dataset attaches to the store through
a client of that process, and worker ``w`` fetches the batches ``w, w + W, ...``: each batch
once, and a rank's ``k``-th batch is its group's ``k``-th batch whatever each rank's W.
A fetch that finds too few ready samples waits for them in the store's controller, up to
``TQ_STREAMING_DATASET_EMPTY_BATCH_SLEEP_INTERVAL`` seconds (1) per try in polling mode.
"""

from __future__ import annotations

import logging
import multiprocessing.context
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from rayless.store import BatchMeta
from rayless.transfer_queue import interface
from rayless.transfer_queue.client import TransferQueueClient, env_seconds

if TYPE_CHECKING:
    from tensordict import TensorDictBase

__all__ = [
    "StreamingDataLoader",
    "StreamingDataset",
    "chunk_batch_fn",
    "default_fetch_batch_fn",
]

EMPTY_WAIT_ENV = "TQ_STREAMING_DATASET_EMPTY_BATCH_SLEEP_INTERVAL"
REPORT_AFTER = 30.0  # seconds without a batch before a warning (then every REPORT_EVERY)
REPORT_EVERY = 60.0

log = logging.getLogger(__name__)

Item = tuple[TensorDict, BatchMeta]


def empty_wait() -> float:
    """Seconds between two tries of a batch that was not ready (``EMPTY_WAIT_ENV``, 1).

    Raises ValueError for a value that is not a number >= 0.
    """
    return env_seconds(EMPTY_WAIT_ENV)


def default_fetch_batch_fn(
    tq_client: TransferQueueClient,
    data_fields: Sequence[str],
    batch_size: int,
    partition_id: str,
    task_name: str,
    sampling_config: dict[str, Any],
    batch_index: int,
    *,
    probe: bool = False,
) -> tuple[TensorDict | None, BatchMeta]:
    """The ``batch_index``-th batch of this rank's group: ``(data, meta)``, or ``(None,
    empty meta)`` when not enough samples were ready (in polling mode, after waiting up to
    ``TQ_STREAMING_DATASET_EMPTY_BATCH_SLEEP_INTERVAL`` s for them in the controller).
    ``probe``: only a batch there now, without waiting, in either mode.

    Raises what ``get_meta`` and ``get_data`` raise (FetchTimeoutError out of polling mode).
    """
    config = {**sampling_config, "batch_index": batch_index, "partition_id": partition_id}
    meta = tq_client.stream_meta(
        data_fields, batch_size, partition_id, task_name, config, empty_wait(), probe
    )
    if meta.size == 0:
        return None, meta
    return tq_client.get_data(meta), meta


def chunk_batch_fn(
    td: TensorDictBase, batch_meta: BatchMeta, micro_batch_size: int = 1
) -> list[Item]:
    """``td`` and its ``batch_meta`` cut into consecutive micro-batches of
    ``micro_batch_size`` samples (the last one may be smaller); jagged nested fields are cut
    too.

    Raises:
        TypeError: ``td`` is not a TensorDict.
        ValueError: ``micro_batch_size`` is not an int >= 1 or exceeds the batch, or ``td``
            has no batch dimension.
    """
    if not isinstance(td, TensorDict):
        raise TypeError(f"Expected TensorDict, got {type(td).__name__}")
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int):
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size}")
    if micro_batch_size <= 0:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size}")
    if len(td.batch_size) == 0:
        raise ValueError("Input TensorDict must have non-empty batch_size")
    total = int(td.batch_size[0])
    if micro_batch_size > total:
        raise ValueError(
            f"micro_batch_size ({micro_batch_size}) exceeds total batch size ({total})"
        )
    # a nested field cannot be sliced along the batch by TensorDict: it is cut on its own
    nested: dict[str, torch.Tensor] = {}
    dense: dict[str, Any] = {}
    for name, value in td.items():
        if isinstance(value, torch.Tensor) and value.is_nested:
            nested[name] = value
        else:
            dense[name] = value
    flat = TensorDict(dense, batch_size=td.batch_size) if dense else None
    out: list[Item] = []
    for start in range(0, total, micro_batch_size):
        end = min(start + micro_batch_size, total)
        part = flat[start:end] if flat is not None else TensorDict({}, batch_size=(end - start,))
        for name, value in nested.items():
            part[name] = _cut(value, start, end)
        out.append((part, batch_meta.select(range(start, end))))
    return out


def _cut(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Samples ``start:end`` of the nested tensor ``t``: a view of a jagged one's values (no
    copy), a new nested tensor of a strided one's samples."""
    jagged: Any = t  # (torch's NestedTensor: offsets(), values(), lengths())
    if (
        t.layout is torch.jagged
        and getattr(t, "_ragged_idx", None) == 1
        and jagged.lengths() is None
    ):
        offsets = jagged.offsets()
        lo, hi = int(offsets[start]), int(offsets[end])
        return torch.nested.nested_tensor_from_jagged(
            jagged.values()[lo:hi], offsets[start : end + 1] - lo
        )
    return torch.nested.as_nested_tensor(list(t.unbind(0)[start:end]), layout=t.layout)


class StreamingDataset(IterableDataset[Item]):
    """TransferQueue's ``StreamingDataset``: ``(TensorDict, BatchMeta)`` micro-batches of a
    partition for one data-parallel group (``dp_rank``); see the module docstring.

    ``config`` (what the controller's ``get_config`` returns) is kept as given: the dataset
    attaches to the cluster's TransferQueue store. ``fetch_batch_fn`` and
    ``process_batch_fn`` replace :func:`default_fetch_batch_fn` and :func:`chunk_batch_fn`
    (same arguments).

    Raises ValueError for ``micro_batch_size`` or ``batch_size`` < 1, no ``data_fields`` or
    ``dp_rank`` < 0; iterating raises what a fetch raises (FetchTimeoutError out of polling
    mode, AssertionError when no TransferQueue runs on the cluster).
    """

    def __init__(
        self,
        config: Any,
        batch_size: int,
        micro_batch_size: int,
        data_fields: list[str],
        partition_id: str,
        task_name: str,
        dp_rank: int,
        should_check_consumption_status: bool = False,
        fetch_batch_fn: Callable[..., tuple[TensorDict | None, BatchMeta]] | None = None,
        process_batch_fn: Callable[..., list[Item]] | None = None,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(data_fields) < 1:
            raise ValueError(
                f"data_fields must be a list with at least one field name, got {data_fields}"
            )
        if dp_rank < 0:
            raise ValueError(f"dp_rank {dp_rank} must be greater than or equal to 0")
        super().__init__()
        self.config = config
        self.batch_size = batch_size
        self.micro_batch_size = micro_batch_size
        self.data_fields = data_fields
        self.partition_id = partition_id
        self.task_name = task_name
        self.dp_rank = dp_rank
        self.should_check_consumption_status = should_check_consumption_status
        self.fetch_batch_fn = fetch_batch_fn or default_fetch_batch_fn
        self.process_batch_fn = process_batch_fn or chunk_batch_fn
        self.sampling_config = {"dp_rank": dp_rank, "task_name": task_name}
        self._tq_client: TransferQueueClient | None = None
        self.buffer: list[Item] = []  # this partition's batches, as fetched
        self.batch_index = 0  # the next batch of the buffer to read

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tq_client"] = None  # a process's own (a spawned worker attaches anew)
        if multiprocessing.context.get_spawning_popen() is not None:  # for a spawned worker:
            interface.attached_client()  # this process's cluster (an actor's: attached now)
        state["_join"] = interface.client_join()  # the cluster a spawned worker joins
        return state

    def _client(self) -> TransferQueueClient:
        """This process's client (attached on first use; a DataLoader worker, forked or
        spawned, gets its own, on the cluster of the process that pickled the dataset)."""
        self._tq_client = interface.attached_client(getattr(self, "_join", None))
        return self._tq_client

    def _done(self, client: TransferQueueClient, worker: int, workers: int) -> bool:
        """Whether the iteration ends: the buffer is read out, the task consumed the
        partition, and (with the default fetch) the group holds no further batch this rank
        has not read: a rank that gets there after its peers took the last samples still
        reads their last batches."""
        if self.batch_index < len(self.buffer) or not self.should_check_consumption_status:
            return False
        if not client.check_consumption_status(self.task_name, self.partition_id):
            return False
        if self.fetch_batch_fn is not default_fetch_batch_fn:
            return True
        td, meta = default_fetch_batch_fn(
            client,
            self.data_fields,
            self.batch_size,
            self.partition_id,
            self.task_name,
            self.sampling_config,
            worker + workers * len(self.buffer),
            probe=True,
        )
        if td is None:
            return True
        self.buffer.append((td, meta))
        return False

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        client = self._client()
        wait = empty_wait()
        since = report = time.monotonic()  # the last batch, the last warning
        while not self._done(client, worker, workers):
            if self.batch_index < len(self.buffer):
                td, meta = self.buffer[self.batch_index]
                self.batch_index += 1
                yield from self.process_batch_fn(td, meta, micro_batch_size=self.micro_batch_size)
                since = report = time.monotonic()
                continue
            began = time.monotonic()
            if began - report >= (REPORT_AFTER if report == since else REPORT_EVERY):
                report = began
                log.warning(
                    "StreamingDataset (dp_rank %d): no batch of %d samples holding %s for %.0f s; "
                    "%s",
                    self.dp_rank,
                    self.batch_size,
                    self.data_fields,
                    began - since,
                    client.describe_partition(self.partition_id, self.task_name),
                )
            td_or_none, meta = self.fetch_batch_fn(
                tq_client=client,
                data_fields=self.data_fields,
                batch_size=self.batch_size,
                partition_id=self.partition_id,
                task_name=self.task_name,
                sampling_config=self.sampling_config,
                batch_index=worker + workers * len(self.buffer),
            )
            if td_or_none is not None:
                self.buffer.append((td_or_none, meta))
            else:  # (a fetch that waited in the controller has waited already)
                time.sleep(max(0.0, wait - (time.monotonic() - began)))

    def reset(self) -> None:
        """Read the buffer again from its first batch (the next iteration replays it)."""
        self.batch_index = 0

    def step(self, partition_id: str) -> None:
        """Move to ``partition_id`` (a training step's new partition): the buffer is emptied
        and the batches count from 0 again."""
        self.buffer = []
        self.batch_index = 0
        self.partition_id = partition_id


def _identity(data: Any) -> Any:
    """The collate of a StreamingDataLoader: the dataset's items are batches already."""
    return data


class StreamingDataLoader(DataLoader[Item]):
    """TransferQueue's ``StreamingDataLoader``: a ``torch.utils.data.DataLoader`` over a
    :class:`StreamingDataset` that yields its ``(TensorDict, BatchMeta)`` items as they are
    (``batch_size=None``, an identity ``collate_fn`` unless one is given)."""

    dataset: StreamingDataset

    def __init__(
        self,
        dataset: StreamingDataset,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
    ) -> None:
        super().__init__(
            dataset,
            batch_size=None,
            num_workers=num_workers,
            collate_fn=collate_fn if collate_fn is not None else _identity,
            pin_memory=pin_memory,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
        )

    def reset(self) -> None:
        """:meth:`StreamingDataset.reset`."""
        self.dataset.reset()

    def step(self, partition_id: str) -> None:
        """:meth:`StreamingDataset.step`."""
        self.dataset.step(partition_id)

    def get_buffer(self) -> list[Item]:
        """The dataset's buffer of fetched ``(TensorDict, BatchMeta)`` batches."""
        return self.dataset.buffer

"""TransferQueue's clients (``AsyncTransferQueueClient``, ``TransferQueueClient``) over a
``rayless.store`` Store.

Each method keeps TransferQueue's name, arguments and return value and runs the store's
operation on the store's home loop (the ``rayless.ray`` session's loop in a driver, the
actor's own loop in an actor): an ``async_`` method may be awaited on any loop, a blocking
one called from any thread but that loop (there it raises RuntimeError: ``await`` the
``async_`` form, as the blocking call would wait on the loop it runs on).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from rayless.store import BatchMeta, StoreTimeoutError, UnknownPartitionError
from rayless.transfer_queue.layout import tq_layout

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict, TensorDictBase

    from rayless.store import Store
    from rayless.store.data.status import PartitionExport

__all__ = ["AsyncTransferQueueClient", "FetchTimeoutError", "TransferQueueClient"]

T = TypeVar("T")
log = logging.getLogger(__name__)

# TransferQueue's bound on a fetch waiting for enough ready samples (seconds, its env name)
FETCH_TIMEOUT_ENV = "TQ_CONTROLLER_GET_METADATA_TIMEOUT"
CALL_TIMEOUT = 300.0  # a blocking call's bound (checkpoints: none)
_MODES = ("fetch", "force_fetch")
_FORCE_TASK = "rayless.transfer_queue.force_fetch"  # a task that never consumes


def _rank_share(sampling_config: Mapping[str, Any] | None) -> tuple[str, int, bool]:
    """The store's kept shared fetch for a rank-aware ``sampling_config``: one batch per
    ``(dp_rank, batch_index)``. Raises RuntimeError without them (or not ints >= 0)."""
    config = sampling_config if isinstance(sampling_config, Mapping) else {}
    dp_rank, batch_index = config.get("dp_rank"), config.get("batch_index")
    for name, value in (("dp_rank", dp_rank), ("batch_index", batch_index)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise RuntimeError(
                f"RankAwareSampler needs sampling_config[{name!r}], an int >= 0 (got "
                f"{value!r}): pass sampling_config={{'dp_rank': ..., 'batch_index': ...}}"
            )
    return (f"rank-aware:{dp_rank}:{batch_index}", 1, True)


class FetchTimeoutError(RuntimeError, TimeoutError):
    """A ``fetch`` whose batch was not ready within the fetch timeout: a RuntimeError, as
    TransferQueue's client raises it, and a TimeoutError."""


def env_seconds(name: str, default: str = "1") -> float:
    """Seconds from the environment variable ``name`` (TransferQueue's knobs; ``default``
    when unset).

    Raises ValueError for a value that is not a number >= 0.
    """
    raw = os.environ.get(name, default)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not value >= 0:
        raise ValueError(f"{name}={raw!r} must be >= 0")
    return value


def fetch_timeout() -> float:
    """How long a ``fetch`` waits for its batch (``TQ_CONTROLLER_GET_METADATA_TIMEOUT``, 1 s).

    Raises ValueError for a value that is not a number >= 0.
    """
    return env_seconds(FETCH_TIMEOUT_ENV)


class AsyncTransferQueueClient:
    """TransferQueue's async client on a store: ``await client.async_put(td, partition_id=
    "train")``, ``async_get_meta``, ``async_get_data``, ``async_clear_samples``, ...

    ``sampler`` is the store sampler ``get_meta`` fetches with (``samplers.store_spec``);
    ``polling_mode`` makes a fetch that is not ready return an empty BatchMeta at once
    instead of raising FetchTimeoutError after ``TQ_CONTROLLER_GET_METADATA_TIMEOUT`` seconds;
    ``rank_aware`` (``RankAwareSampler``) shares a fetch's batch by ``sampling_config``'s
    ``dp_rank`` and ``batch_index``.
    """

    def __init__(
        self,
        store: Store,
        loop: asyncio.AbstractEventLoop,
        *,
        client_id: str | None = None,
        sampler: Any = None,
        polling_mode: bool = False,
        rank_aware: bool = False,
    ) -> None:
        self.store = store
        self.client_id = client_id or f"TransferQueueClient_{os.getpid()}"
        self._loop = loop
        self._sampler = sampler
        self._polling = polling_mode
        self._rank_aware = rank_aware

    # -- where the store's work runs ---------------------------------------------------

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    async def _home(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the store's loop from whatever loop runs this."""
        if self._on_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def _block(self, coro: Coroutine[Any, Any, T], timeout: float | None = CALL_TIMEOUT) -> T:
        """Run ``coro`` on the store's loop and wait for it (at most ``timeout`` s).

        Raises RuntimeError on the store's own loop; TimeoutError when ``timeout`` passes
        (the operation is cancelled).
        """
        if self._on_loop():
            coro.close()
            raise RuntimeError(
                "a blocking TransferQueueClient call on the event loop it needs would wait "
                "for good: await the async_ form (e.g. `await client.async_get_data(meta)`)"
            )
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except (TimeoutError, concurrent.futures.TimeoutError):  # (one class since 3.11)
            if future.done():  # the operation's own error, a TimeoutError
                raise
            future.cancel()
            raise TimeoutError(f"the call did not finish within {timeout}s") from None

    # -- TransferQueue's operations ----------------------------------------------------

    async def async_get_meta(
        self,
        data_fields: list[str],
        batch_size: int,
        partition_id: str,
        mode: str = "fetch",
        task_name: str | None = None,
        sampling_config: dict[str, Any] | None = None,
    ) -> BatchMeta:
        """Metadata of ``batch_size`` ready samples of ``partition_id`` holding
        ``data_fields``, marked consumed by ``task_name`` (``mode="fetch"``); or of every
        sample of the partition that holds them, consuming nothing (``"force_fetch"``).

        With ``RankAwareSampler`` a fetch needs ``sampling_config``'s ``dp_rank`` and
        ``batch_index``: every fetch with the same pair (and task and partition) gets the
        same batch, kept until the partition or one of its samples is cleared; other
        samplers ignore ``sampling_config``, as TransferQueue's do.

        Raises:
            FetchTimeoutError: (fetch) not enough ready samples within the fetch timeout
                (a RuntimeError, TransferQueue's error, and a TimeoutError; in polling mode
                an empty BatchMeta is returned instead).
            AssertionError: a fetch without ``task_name``.
            RuntimeError: a rank-aware fetch without ``dp_rank`` and ``batch_index`` ints
                >= 0 in ``sampling_config`` (TransferQueue's controller's error).
            ValueError: another mode.
        """
        wait = 0.0 if self._polling else fetch_timeout()
        return await self._get_meta(
            data_fields, batch_size, partition_id, mode, task_name, sampling_config, wait
        )

    async def _get_meta(
        self,
        data_fields: Sequence[str],
        batch_size: int,
        partition_id: str,
        mode: str,
        task_name: str | None,
        sampling_config: Mapping[str, Any] | None,
        wait: float,
        empty: bool | None = None,
    ) -> BatchMeta:
        """:meth:`async_get_meta` waiting ``wait`` s for a batch not ready yet (a streaming
        dataset in polling mode waits in the controller instead of sleeping); a batch not
        ready then is an empty BatchMeta where ``empty`` (None: in polling mode), else
        FetchTimeoutError."""
        if empty is None:
            empty = self._polling
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        fields = list(data_fields)
        if mode == "force_fetch":
            return await self._home(
                self.store.get_meta(partition_id, fields, None, task=_FORCE_TASK, mode="peek")
            )
        if task_name is None:
            raise AssertionError("a fetch needs task_name")
        share = _rank_share(sampling_config) if self._rank_aware else None
        try:
            return await self._home(
                self.store.get_meta(
                    partition_id,
                    fields,
                    batch_size,
                    task=task_name,
                    mode="fetch",
                    sampler=self._sampler,
                    timeout=wait,
                    share=share,
                )
            )
        except StoreTimeoutError as exc:
            if empty:
                return BatchMeta(self.store.store_id, (), (), (), ())
            raise FetchTimeoutError(
                f"Timeout while waiting for sufficient data for task {task_name}. "
                f"Required: {batch_size}: {exc}"
            ) from exc

    async def async_put(
        self,
        data: TensorDictBase,
        metadata: BatchMeta | None = None,
        partition_id: str | None = None,
        data_parser: Callable[[Any], Any] | None = None,
    ) -> BatchMeta:
        """Store ``data`` as new samples of ``partition_id``, or its fields onto the samples
        of ``metadata``; returns the samples' metadata.

        Raises ValueError (neither metadata nor partition_id; a ``data_parser``: parse the
        data before the put) and the store's errors (StoreInputError is a ValueError).
        """
        if data_parser is not None:
            raise ValueError("data_parser is not supported by rayless.transfer_queue")
        if metadata is None and partition_id is None:
            raise ValueError("partition_id must be provided if metadata is not given")
        if metadata is not None:
            return await self._home(self.store.put(data, meta=metadata))
        return await self._home(self.store.put(data, partition_id))

    async def async_get_data(self, metadata: BatchMeta) -> TensorDict:
        """The samples of ``metadata`` (its fields) as a TensorDict in TransferQueue's layout
        (``layout.tq_layout``: fields with per-sample dimensions jagged)."""
        return tq_layout(await self._home(self.store.get(metadata)))

    async def async_set_custom_meta(self, metadata: BatchMeta) -> None:
        """Store ``metadata.custom_meta`` (one dict per sample) with its samples."""
        await self._home(self.store.set_custom_meta(metadata, list(metadata.custom_meta)))

    async def async_clear_samples(self, metadata: BatchMeta) -> None:
        """Delete the samples of ``metadata``."""
        await self._home(self.store.clear(metadata))

    async def async_clear_partition(self, partition_id: str) -> None:
        """Delete every sample of ``partition_id``."""
        await self._home(self.store.clear_partition(partition_id))

    async def async_check_consumption_status(self, task_name: str, partition_id: str) -> bool:
        """Whether ``task_name`` consumed every sample of ``partition_id`` (False for an
        empty or unknown partition)."""
        try:
            status = await self._home(self.store.consumption_status(partition_id, task_name))
        except UnknownPartitionError:
            return False
        return status["samples"] > 0 and status["consumed"] >= status["samples"]

    async def async_check_production_status(
        self, data_fields: Sequence[str], partition_id: str
    ) -> bool:
        """Whether every sample of ``partition_id`` holds every field of ``data_fields``
        (False for an empty or unknown partition)."""
        try:
            status = await self._home(self.store.production_status(partition_id))
        except UnknownPartitionError:
            return False
        samples = status["samples"]
        held = status["fields"]
        return samples > 0 and all(held.get(f, 0) >= samples for f in data_fields)

    async def async_reset_consumption(
        self, partition_id: str, task_name: str | None = None
    ) -> bool:
        """Make the samples of ``partition_id`` fetchable again for ``task_name`` (None:
        every task); True once done."""
        await self._home(self.store.reset_consumption(task_name, partition_id))
        return True

    async def async_get_partition_list(self) -> list[str]:
        """The partitions that hold samples."""
        return await self._home(self.store.partitions())

    async def async_kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, Any]]:
        """``{partition: {key: tag}}`` of one partition (None: all)."""
        return await self._home(self.store.kv_list(partition_id))

    async def async_kv_retrieve_keys(
        self, global_indexes: list[int] | int, partition_id: str
    ) -> list[str | None]:
        """The KV key of each of ``global_indexes`` (a BatchMeta's) in ``partition_id``;
        None for a sample without a key or not of the partition, as TransferQueue returns.

        Raises:
            TypeError: not an int or a list of int.
            ValueError: an empty list.
        """
        if isinstance(global_indexes, int) and not isinstance(global_indexes, bool):
            global_indexes = [global_indexes]
        elif isinstance(global_indexes, list):
            if not global_indexes:
                raise ValueError("Received an empty list as `global_indexes`.")
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in global_indexes):
                raise TypeError("Not all elements in `global_indexes` are int.")
        else:
            raise TypeError("Only int or list of int are allowed as `global_indexes`.")
        return await self._home(self.store.kv_keys_of(partition_id, global_indexes))

    async def async_kv_retrieve_meta(
        self, keys: list[str] | str, partition_id: str, create: bool = False
    ) -> BatchMeta:
        """The BatchMeta of ``keys`` in ``partition_id`` (with the fields all of them hold),
        in their order; keys the partition lacks are left out (a warning names them), an
        unknown partition gives an empty BatchMeta.

        Raises:
            TypeError: not a str or a list of str.
            ValueError: an empty list; ``create=True`` (keys are made by ``kv_batch_put`` or
                ``kv_put`` here, with their data).
        """
        if isinstance(keys, str):
            keys = [keys]
        elif isinstance(keys, list):
            if not keys:
                raise ValueError("Received an empty list as keys.")
            if not all(isinstance(k, str) for k in keys):
                raise TypeError("Not all elements in `keys` are strings.")
        else:
            raise TypeError("Only string or list of strings are allowed as `keys`.")
        if create:
            raise ValueError(
                "kv_retrieve_meta(create=True) is not supported by rayless.transfer_queue: "
                "make keys with kv_batch_put/kv_put (their data with them)"
            )
        meta, missing = await self._home(self.store.kv_lookup(partition_id, keys))
        if missing:
            log.warning(
                "keys %s were not found in partition %r: they are left out of the BatchMeta",
                [keys[i] for i in missing[:8]],
                partition_id,
            )
        return meta

    async def async_get_consumption_status(
        self, task_name: str, partition_id: str
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(global indexes, consumed)`` of every sample of ``partition_id``, sorted by
        index: ``consumed`` is 1 where ``task_name`` consumed the sample, else 0 (int8).
        ``(None, None)`` for an unknown partition. Reads the whole partition's status."""
        import torch

        export = await self._export(partition_id)
        if export is None:
            return None, None
        indexes = sorted(s.index for s in export.samples)
        done = set(export.consumed.get(task_name, ()))
        status = [1 if i in done else 0 for i in indexes]
        return torch.tensor(indexes, dtype=torch.long), torch.tensor(status, dtype=torch.int8)

    async def async_get_production_status(
        self, data_fields: list[str], partition_id: str
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(global indexes, produced)`` of every sample of ``partition_id``, sorted by
        index: ``produced[i, j]`` is 1 where sample ``i`` holds ``data_fields[j]`` (int8).
        ``(None, None)`` for an unknown partition, no fields or a field no sample holds.
        Reads the whole partition's status."""
        import torch

        export = await self._export(partition_id)
        if export is None or not data_fields:
            return None, None
        samples = sorted(export.samples, key=lambda s: s.index)
        held = {f for s in samples for f in s.fields}
        if any(f not in held for f in data_fields):
            return None, None
        rows = [[1 if f in s.fields else 0 for f in data_fields] for s in samples]
        indexes = torch.tensor([s.index for s in samples], dtype=torch.long)
        return indexes, torch.tensor(rows, dtype=torch.int8).reshape(len(samples), -1)

    async def _export(self, partition_id: str) -> PartitionExport | None:
        try:
            export: PartitionExport = await self._home(self.store.export_partition(partition_id))
        except UnknownPartitionError:
            return None
        return export

    def close(self) -> None:
        """End this client (idempotent): the creator's also kills the store, another's only
        detaches (``Store.aclose``). A closed loop (its cluster ended, and the store with it)
        leaves nothing to do. Raises RuntimeError on the store's own loop."""
        if not self._loop.is_closed():
            self._block(self.store.aclose(), 60)


def _blocking(name: str) -> Callable[..., Any]:
    async_method = getattr(AsyncTransferQueueClient, f"async_{name}")

    def call(self: TransferQueueClient, *args: Any, **kwargs: Any) -> Any:
        return self._block(async_method(self, *args, **kwargs))

    call.__name__ = name
    call.__qualname__ = f"TransferQueueClient.{name}"
    call.__doc__ = f"Blocking ``async_{name}``: " + (async_method.__doc__ or "")
    return call


class TransferQueueClient(AsyncTransferQueueClient):
    """TransferQueue's client: every ``async_x`` of :class:`AsyncTransferQueueClient` also as
    a blocking ``x`` (``client.put(td, partition_id="train")``, ``client.get_meta(...)``,
    ``client.get_data(meta)``, ...), bounded by CALL_TIMEOUT (TimeoutError)."""

    get_meta = _blocking("get_meta")

    def describe_partition(self, partition_id: str, task_name: str) -> str:
        """What ``partition_id`` holds, for a message about a fetch that waits: its samples,
        how many hold each field, how many ``task_name`` consumed."""
        try:
            status = self._block(self.store.production_status(partition_id), 30)
            consumed = self._block(self.store.consumption_status(partition_id, task_name), 30)
        except UnknownPartitionError:
            return f"partition {partition_id!r} does not exist (yet)"
        fields = ", ".join(f"{k}: {v}" for k, v in sorted(status["fields"].items()))
        return (
            f"partition {partition_id!r} has {status['samples']} samples (holding each field: "
            f"{fields or 'none'}), {consumed['consumed']} consumed by {task_name!r}"
        )

    def stream_meta(
        self,
        data_fields: Sequence[str],
        batch_size: int,
        partition_id: str,
        task_name: str,
        sampling_config: Mapping[str, Any] | None,
        wait: float,
        probe: bool = False,
    ) -> BatchMeta:
        """``get_meta`` (a fetch) for a streaming dataset: in polling mode it waits up to
        ``wait`` s in the controller for the batch (an empty BatchMeta after that), instead
        of returning at once and sleeping; otherwise as ``get_meta``. ``probe``: only what
        is there now (a batch the rank's group holds already), an empty BatchMeta if
        nothing, in either mode."""
        timeout = 0.0 if probe else wait if self._polling else fetch_timeout()
        try:
            return self._block(
                self._get_meta(
                    data_fields,
                    batch_size,
                    partition_id,
                    "fetch",
                    task_name,
                    sampling_config,
                    timeout,
                    empty=True if probe else None,
                )
            )
        except FetchTimeoutError as exc:  # (as TransferQueue's, out of polling mode)
            raise FetchTimeoutError(
                f"{exc}; a StreamingDataset waits for new samples only in polling mode "
                "(tq.init({'controller': {'polling_mode': True}}), as with TransferQueue); "
                f"out of it a fetch waits {FETCH_TIMEOUT_ENV} seconds ({timeout:g})"
            ) from exc.__cause__

    put = _blocking("put")
    get_data = _blocking("get_data")
    set_custom_meta = _blocking("set_custom_meta")
    clear_samples = _blocking("clear_samples")
    clear_partition = _blocking("clear_partition")
    check_consumption_status = _blocking("check_consumption_status")
    check_production_status = _blocking("check_production_status")
    reset_consumption = _blocking("reset_consumption")
    get_partition_list = _blocking("get_partition_list")
    kv_list = _blocking("kv_list")
    kv_retrieve_keys = _blocking("kv_retrieve_keys")
    kv_retrieve_meta = _blocking("kv_retrieve_meta")
    get_consumption_status = _blocking("get_consumption_status")
    get_production_status = _blocking("get_production_status")

"""TransferQueue's module-level interface (``tq.init``, ``tq.kv_batch_put``, ...) over one
``rayless.store`` Store per cluster.

``init(conf)`` in the first process creates the store (its controller is named
:data:`STORE_NAME`) on the ``rayless.ray`` session's cluster (``ray.init()`` first if
there is none, as Ray's actors do); in any other process of the cluster (a worker actor, a
task, a second driver) it attaches to that store. The functions below that need a client
attach on first use, as TransferQueue's do. ``close()`` ends the store in the process that
created it, and only detaches elsewhere.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import multiprocessing.util
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayless.actors.ext import ChildJoin, Portal
from rayless.errors import ActorNotFoundError, NameTakenError
from rayless.ray import _worker
from rayless.store import CheckpointNotFoundError, Store
from rayless.store.client.loader import close_in_worker, open_in_worker
from rayless.transfer_queue import samplers
from rayless.transfer_queue.client import TransferQueueClient
from rayless.transfer_queue.layout import tq_layout

if TYPE_CHECKING:
    from tensordict import TensorDict, TensorDictBase

    from rayless.store.client.store import KVBatchMeta

__all__ = [
    "STORE_NAME",
    "async_kv_batch_get",
    "async_kv_batch_get_by_meta",
    "async_kv_batch_put",
    "async_kv_clear",
    "async_kv_list",
    "async_kv_put",
    "attached_client",
    "close",
    "get_client",
    "get_metrics_endpoint",
    "init",
    "kv_batch_get",
    "kv_batch_get_by_meta",
    "kv_batch_put",
    "kv_clear",
    "kv_list",
    "kv_put",
    "load_checkpoint",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

# TransferQueue's controller is its namespace's actor: ray.get_actor(NAME, namespace=...)
NAMESPACE = "transfer_queue"
STORE_NAME = f"{NAMESPACE}/TransferQueueController"
BACKENDS = ("SimpleStorage",)
NOT_INITIALIZED = "TransferQueueController has not been initialized yet. Please call init() first."

# TransferQueue's defaults (its config.yaml) for the keys this module reads.
DEFAULTS: dict[str, Any] = {
    "metrics": {"enabled": False, "port": 0},
    "controller": {"sampler": "SequentialSampler", "polling_mode": False, "zmq_info": None},
    "backend": {
        "storage_backend": "SimpleStorage",
        "SimpleStorage": {"total_storage_size": None, "num_data_storage_units": 2},
    },
}


class _State:
    """This process's client (its store closes the store where it created it); ``forked``
    in a child forked from a process that had one (a DataLoader worker)."""

    def __init__(self, forked: bool = False) -> None:
        self.client: TransferQueueClient | None = None
        self.join: ChildJoin | None = None  # the client's cluster (a spawned worker joins it)
        self.lock = threading.Lock()
        self.forked = forked


_state = _State()


def _forget_parent() -> None:
    """In a forked child: the parent's client (its loop thread is not in this process) and
    its lock are not this process's; the child attaches on first use (:func:`_attach_fork`)."""
    global _state
    _state = _State(forked=True)


os.register_at_fork(after_in_child=_forget_parent)


def _plain(conf: Any) -> dict[str, Any]:
    """``conf`` (a Mapping or an OmegaConf config) as plain nested dicts."""
    if conf is None:
        return {}
    if not isinstance(conf, Mapping) and type(conf).__module__.startswith("omegaconf"):
        # (imported by name: omegaconf is the caller's, never a dependency of ours)
        omegaconf = importlib.import_module("omegaconf")
        return _plain(omegaconf.OmegaConf.to_container(conf, resolve=True))
    if not isinstance(conf, Mapping):
        raise ValueError(f"a TransferQueue config must be a mapping, got {type(conf).__name__}")
    return {k: _plain(v) if isinstance(v, Mapping) else v for k, v in conf.items()}


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _settings(conf: dict[str, Any]) -> dict[str, Any]:
    """What every client needs of the config (kept by the store's controller).

    Raises ValueError: an unknown sampler or backend, a bad unit count.
    """
    controller = conf.get("controller", {})
    backend = conf.get("backend", {})
    name = backend.get("storage_backend", "SimpleStorage")
    if name not in BACKENDS:
        raise ValueError(
            f"storage_backend {name!r} is not available in rayless.transfer_queue: its data "
            f"lives in rayless.store's units (one of {BACKENDS})"
        )
    sampler = controller.get("sampler", "SequentialSampler")
    shown = _merge(conf, {"controller": {"sampler": samplers.sampler_name(sampler)}})
    return {
        "sampler": samplers.store_spec(sampler),
        "polling_mode": bool(controller.get("polling_mode", False)),
        "rank_aware": samplers.rank_aware(sampler),
        "config": _json(shown),  # what the controller's get_config returns
    }


def _json(value: Any) -> Any:
    """``value`` with whatever is not a JSON value shown as its ``str``."""
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _units(conf: dict[str, Any]) -> int:
    n = conf.get("backend", {}).get("SimpleStorage", {}).get("num_data_storage_units", 2)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"num_data_storage_units must be a positive int, got {n!r}")
    return n


def _client(
    store: Store, loop: asyncio.AbstractEventLoop, settings: Mapping[str, Any]
) -> TransferQueueClient:
    """This process's client of ``store``, whose work runs on ``loop``."""
    _state.join = None if store.cluster is None else ChildJoin.of(store.cluster)
    _state.client = TransferQueueClient(
        store,
        loop,
        sampler=settings.get("sampler"),
        polling_mode=bool(settings.get("polling_mode", False)),
        rank_aware=bool(settings.get("rank_aware", False)),
    )
    return _state.client


async def _connect(session: _worker.Session) -> tuple[Store, dict[str, Any]]:
    store = await Store.connect(STORE_NAME, await session.cluster())
    return store, await store.client_settings()


async def _create(
    session: _worker.Session, units: int, settings: dict[str, Any]
) -> tuple[Store, dict[str, Any]]:
    cluster = await session.cluster()
    try:
        store = await Store.create(
            cluster, num_units=units, name=STORE_NAME, client_settings=settings
        )
    except NameTakenError:  # another process created it first: attach to that one
        return await _connect(session)
    return store, settings


def _attach(join: ChildJoin | None = None) -> bool:
    """Attach this process to the cluster's store if there is one (and no client yet).

    ``join``: the cluster of the process this one was spawned for (a DataLoader worker of a
    driver or an actor: it has no session of its own, and ``ray.init()`` there would start
    another cluster)."""
    if _state.client is not None:
        return True
    if _state.forked:
        return _attach_own(None)
    spawned = join is not None and (join.token is not None or not _worker.in_actor())
    if spawned and _worker.current() is None:
        return _attach_own(join)
    session = _worker.session()
    try:
        store, settings = _worker.run(session, _connect(session), timeout=120)
    except ActorNotFoundError:
        return False
    _client(store, session.loop, settings)
    return True


def _attach_own(join: ChildJoin | None) -> bool:
    """Attach a DataLoader worker (forked, or spawned with its parent's cluster ``join``)
    to the store through a client of its own, on its own loop (closed at its exit)."""
    portal = Portal("rayless-tq-worker")
    try:
        store, cluster = portal.run(open_in_worker(STORE_NAME, join), 120)
        settings = portal.run(store.client_settings(), 60)
    except BaseException as exc:
        portal.stop()
        if isinstance(exc, ActorNotFoundError):
            return False
        raise
    _client(store, portal.loop, settings)
    # run by the worker's exit (multiprocessing's, not atexit: a DataLoader worker os._exit()s)
    multiprocessing.util.Finalize(None, close_in_worker, (portal, store, cluster), exitpriority=10)
    return True


def init(conf: Any = None) -> dict[str, Any] | None:
    """Start TransferQueue on the cluster, or attach to the one already running.

    The first call in a cluster creates the store from ``conf`` merged over the defaults
    (``controller.sampler``, ``controller.polling_mode``,
    ``backend.SimpleStorage.num_data_storage_units``) and returns the merged config; a call
    that finds the store attaches and returns ``conf`` unchanged (as TransferQueue, which
    then ignores it).

    Raises:
        ValueError: an unknown sampler or storage backend, a bad unit count, a config that
            is not a mapping.
        RuntimeError: called on the event loop of an ``async def`` actor method (use it
            from a sync method, or at the actor's start).
    """
    with _state.lock:
        if _attach():
            return conf
        final = _merge(DEFAULTS, _plain(conf))
        settings = _settings(final)
        units = _units(final)
        session = _worker.session()
        store, settings = _worker.run(session, _create(session, units, settings), 300)
        _client(store, session.loop, settings)
        if final.get("metrics", {}).get("enabled"):
            log.warning(
                "TransferQueue's Prometheus exporter is not started by rayless.transfer_queue: "
                "the store's metrics are in `rayless status` and `store.metrics()`"
            )
        return final


def close() -> None:
    """End TransferQueue: the process that created the store kills it, any other one only
    detaches. Idempotent; never raises for a cluster that is already gone."""
    with _state.lock:
        client, _state.client = _state.client, None
    if client is None:
        return
    try:
        client.close()
    except Exception as exc:  # the cluster went away first: nothing is left to end
        log.debug("tq.close: %s", exc)


def get_metrics_endpoint() -> str | None:
    """None: rayless.transfer_queue starts no Prometheus exporter."""
    return None


def get_client() -> TransferQueueClient:
    """This process's client (for TransferQueue's low-level API).

    Raises AssertionError before ``init()``, as TransferQueue does (a child forked from a
    process with a client attaches instead)."""
    if _state.client is None and _state.forked:
        return attached_client()
    if _state.client is None:
        raise AssertionError("Please initialize the TransferQueue first by calling `tq.init()`!")
    return _state.client


def attached_client(join: ChildJoin | None = None) -> TransferQueueClient:
    """The client, attaching to the cluster's store on first use (``join``: see
    :func:`_attach`). Raises AssertionError when no store was started (TransferQueue's
    error)."""
    with _state.lock:
        if not _attach(join) or _state.client is None:
            raise AssertionError(NOT_INITIALIZED)
        return _state.client


def client_join() -> ChildJoin | None:
    """How a process spawned by this one joins the cluster of this process's client (None:
    no client yet)."""
    return _state.join if _state.client is not None else None


async def _aclient() -> TransferQueueClient:
    """:func:`attached_client` for the ``async_`` functions: on the store's own loop (an
    ``async def`` actor method) it attaches without blocking that loop."""
    client = _state.client
    if client is not None:
        return client
    session = _worker.session()
    if not _worker.on_loop(session):
        return attached_client()
    try:
        store, settings = await _connect(session)
    except ActorNotFoundError:
        raise AssertionError(NOT_INITIALIZED) from None
    with _state.lock:  # (never held across an await)
        spare = store if _state.client is not None else None
        if spare is None:
            _client(store, session.loop, settings)
        client = _state.client
    if spare is not None:  # another call attached first
        await spare.aclose()
    assert client is not None
    return client


# -- KV interface ------------------------------------------------------------------------


async def async_kv_put(
    key: str,
    partition_id: str,
    fields: TensorDictBase | dict[str, Any] | None = None,
    tag: dict[str, Any] | None = None,
    data_parser: Any = None,
) -> KVBatchMeta:
    """Put one key's ``fields`` (a dict of one sample's values, or a TensorDict of batch
    size 1) and/or its ``tag``; returns its KVBatchMeta.

    Raises ValueError (neither fields nor tag; a ``data_parser``) and the store's errors.
    """
    client = await _aclient()
    _no_parser(data_parser)
    if fields is None and tag is None:
        raise ValueError("Please provide at least one parameter of `fields` or `tag`.")
    meta = await client._home(
        client.store.kv_put(key=key, partition_id=partition_id, fields=fields, tag=tag)
    )
    assert meta is not None
    return meta


async def async_kv_batch_put(
    keys: list[str],
    partition_id: str,
    fields: TensorDictBase | None = None,
    tags: list[dict[str, Any]] | None = None,
    data_parser: Any = None,
) -> KVBatchMeta:
    """Put ``fields`` (batch size ``len(keys)``) and/or ``tags`` for ``keys``; returns their
    KVBatchMeta. Raises ValueError (neither fields nor tags, lengths that differ, a
    ``data_parser``) and the store's errors."""
    client = await _aclient()
    _no_parser(data_parser)
    return await client._home(client.store.kv_batch_put(keys, partition_id, fields, tags))


async def async_kv_batch_get(
    keys: list[str] | str, partition_id: str, select_fields: list[str] | str | None = None
) -> TensorDict:
    """The samples of ``keys`` (``select_fields`` of them; None: all) as a TensorDict in
    TransferQueue's layout (``layout.tq_layout``: fields with per-sample dimensions jagged).
    Raises the store's UnknownKeyError (a ValueError) for keys it does not hold."""
    client = await _aclient()
    found = await client._home(client.store.kv_batch_get(keys, partition_id, select_fields))
    return tq_layout(found)


async def async_kv_batch_get_by_meta(
    meta: KVBatchMeta, select_fields: list[str] | str | None = None
) -> TensorDict:
    """The samples of ``meta``'s keys: ``select_fields``, else the fields ``meta`` names.

    Raises ValueError when ``meta`` has no partition or ``select_fields`` names a field that
    ``meta`` lacks."""
    if meta.partition_id is None:
        raise ValueError("the KVBatchMeta names no partition_id")
    wanted: Sequence[str] | None
    if select_fields is None:
        wanted = meta.fields
    else:
        wanted = [select_fields] if isinstance(select_fields, str) else list(select_fields)
        unknown = sorted(set(wanted) - set(meta.fields or ()))
        if meta.fields is not None and unknown:
            raise ValueError(f"fields {unknown} are not in the KVBatchMeta's fields")
    return await async_kv_batch_get(
        list(meta.keys), meta.partition_id, None if wanted is None else list(wanted)
    )


async def async_kv_list(partition_id: str | None = None) -> dict[str, dict[str, Any]]:
    """``{partition: {key: tag}}`` of one partition (None: every partition)."""
    client = await _aclient()
    return await client._home(client.store.kv_list(partition_id))


async def async_kv_clear(keys: list[str] | str, partition_id: str) -> None:
    """Delete ``keys`` of ``partition_id`` (absent keys are skipped)."""
    client = await _aclient()
    await client._home(client.store.kv_clear(keys, partition_id))


def _no_parser(data_parser: Any) -> None:
    if data_parser is not None:
        raise ValueError(
            "data_parser is not supported by rayless.transfer_queue: parse the values "
            "before the put"
        )


def kv_put(
    key: str,
    partition_id: str,
    fields: TensorDictBase | dict[str, Any] | None = None,
    tag: dict[str, Any] | None = None,
    data_parser: Any = None,
) -> KVBatchMeta:
    """Blocking :func:`async_kv_put`."""
    return attached_client()._block(async_kv_put(key, partition_id, fields, tag, data_parser))


def kv_batch_put(
    keys: list[str],
    partition_id: str,
    fields: TensorDictBase | None = None,
    tags: list[dict[str, Any]] | None = None,
    data_parser: Any = None,
) -> KVBatchMeta:
    """Blocking :func:`async_kv_batch_put`."""
    return attached_client()._block(
        async_kv_batch_put(keys, partition_id, fields, tags, data_parser)
    )


def kv_batch_get(
    keys: list[str] | str, partition_id: str, select_fields: list[str] | str | None = None
) -> TensorDict:
    """Blocking :func:`async_kv_batch_get`."""
    return attached_client()._block(async_kv_batch_get(keys, partition_id, select_fields))


def kv_batch_get_by_meta(
    meta: KVBatchMeta, select_fields: list[str] | str | None = None
) -> TensorDict:
    """Blocking :func:`async_kv_batch_get_by_meta`."""
    return attached_client()._block(async_kv_batch_get_by_meta(meta, select_fields))


def kv_list(partition_id: str | None = None) -> dict[str, dict[str, Any]]:
    """Blocking :func:`async_kv_list`."""
    return attached_client()._block(async_kv_list(partition_id))


def kv_clear(keys: list[str] | str, partition_id: str) -> None:
    """Blocking :func:`async_kv_clear`."""
    attached_client()._block(async_kv_clear(keys, partition_id))


# -- checkpoints -------------------------------------------------------------------------


def save_checkpoint(
    checkpoint_dir: str | Path,
    *,
    include_storage: bool = True,
    metadata: dict[str, Any] | None = None,
) -> None:
    """Save every partition (samples, keys, tags, consumption) and ``metadata`` to
    ``checkpoint_dir``, replacing a checkpoint already there only once the new one is
    complete (``include_storage`` is ignored: the data is always saved, as TransferQueue
    does for its in-memory storage).

    Raises RuntimeError before ``init()``, ValueError for metadata that is not JSON, OSError.
    """
    if _state.client is None:
        raise RuntimeError("TransferQueue is not initialized. Call tq.init() first.")
    client = _state.client
    target = Path(checkpoint_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=target.parent))
    old: Path | None = None
    try:
        client._block(client.store.save_checkpoint(fresh, metadata=metadata or {}), None)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.rename(target, old / "checkpoint")
        os.rename(fresh, target)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        if old is not None and not target.exists():
            os.rename(old / "checkpoint", target)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(checkpoint_dir: str | Path) -> None:
    """Restore the store to a checkpoint: every partition is cleared, then the checkpoint's
    samples are put back (their keys, tags and consumption with them).

    Raises RuntimeError before ``init()``, FileNotFoundError (the store's
    CheckpointNotFoundError) when there is no checkpoint there.
    """
    if _state.client is None:
        raise RuntimeError("TransferQueue is not initialized. Call tq.init() first.")
    client = _state.client
    client._block(_restore(client.store, Path(checkpoint_dir)), None)


async def _restore(store: Store, directory: Path) -> None:
    if not (directory / "manifest.json").is_file():  # (as the store's load raises it)
        raise CheckpointNotFoundError(f"no checkpoint manifest at {str(directory)!r}")
    for partition in await store.partitions():
        await store.clear_partition(partition)
    await store.load_checkpoint(directory)

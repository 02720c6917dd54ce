"""Checkpoints of a store's partitions: save to a directory, restore into any store.

Layout::

    DIR/manifest.json          {"format": "rayless-store-checkpoint", "version": 1,
                                "store_id": ..., "metadata": {the caller's},
                                "partitions": [{"name", "group_size",
                                "consumed": {task: [sample numbers]}, "groups": [...]}]}
    DIR/p<i>-g<j>.pt           the data of one group of samples (those holding the same
                               fields), a TensorDict saved with torch.save

A partition's samples are numbered in allocation order; each *group* (samples with the same
ready fields) records its sample numbers, keys, group ids and tags, and its data file.
Restoring puts each group as new samples (keys, group ids, tags kept) into the target store
— whatever its unit count — then marks the consumed samples consumed per task again, so a
trainer resumes where it stopped. A load is all or nothing: the whole manifest, every data
file and the room on the target's units are checked before anything is written
(CheckpointError names the problem), puts do not wait for room, and a load that fails
part-way clears the partitions it created, so it can be retried. Samples lost with their
unit or in an unfinished put are not saved. Save while producers are quiet: a checkpoint is
read partition by partition, not as one snapshot. Loading unpickles the data files
(``torch.load(weights_only=False)``): load only checkpoints you wrote.

``save(..., metadata={...})`` keeps the caller's JSON object (a step number, a time) in the
manifest; a load returns it as ``Restored.metadata`` (TransferQueue's ``user_metadata``). A
directory without a manifest raises CheckpointNotFoundError, which is also a
``FileNotFoundError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict, TensorDictBase

from rayless.actors import ActorDiedError
from rayless.store.data.messages import UnitView
from rayless.store.data.meta import BatchMeta
from rayless.store.data.schema import (
    estimate_plain_bytes,
    field_key,
    split_columns,
    tensor_bytes,
)
from rayless.store.data.status import PartitionExport, UnitStats
from rayless.store.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    StoreError,
    StoreInputError,
)
from rayless.transport.ext import atomic_file, atomic_write

if TYPE_CHECKING:
    from rayless.store.client.store import Store

__all__ = ["FORMAT", "CheckpointError", "Restored", "load", "save"]

FORMAT = "rayless-store-checkpoint"
VERSION = 1


class Restored(dict[str, list[int]]):
    """What a load returns: per partition, the new global index of each saved sample (in
    saved order), and ``metadata``, the object given to ``save`` (``{}`` if none)."""

    def __init__(self, indexes: Mapping[str, list[int]], metadata: Mapping[str, Any]) -> None:
        super().__init__(indexes)
        self.metadata: dict[str, Any] = dict(metadata)


def _group_key(value: Any) -> Any:
    return tuple(_group_key(v) for v in value) if isinstance(value, list) else value


async def save(
    store: Store, directory: Path, metadata: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Write every partition of ``store`` to ``directory`` (created; must be empty), with the
    caller's ``metadata`` (a JSON object). Returns the manifest. Raises StoreInputError for a
    non-empty directory or metadata that is not a JSON object (nothing written then)."""
    user = _metadata(metadata)
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):
        raise StoreInputError(f"checkpoint directory {str(directory)!r} is not empty")
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "store_id": store.store_id,
        "metadata": user,
        "partitions": [],
    }
    for p_num, partition in enumerate(await store.partitions()):
        info: PartitionExport = await store.controller.export_partition(partition)
        samples = info.samples
        number = {s.index: k for k, s in enumerate(samples)}
        by_fields: dict[tuple[str, ...], list[int]] = {}
        for k, s in enumerate(samples):
            by_fields.setdefault(tuple(s.fields), []).append(k)
        groups: list[dict[str, Any]] = []
        for fields, members in by_fields.items():
            chunks: list[tuple[list[int], Any]] = [(members, None)]
            if fields:
                meta = await store.controller.meta_of(
                    partition, [samples[k].index for k in members], list(fields)
                )
                chunks = await _dense_chunks(store, meta, members)
            for chunk, td in chunks:
                entry: dict[str, Any] = {
                    "samples": chunk,
                    "fields": list(fields),
                    "keys": [samples[k].key for k in chunk],
                    "group_ids": [samples[k].group for k in chunk],
                    "tags": [dict(samples[k].custom) for k in chunk],
                    "file": None,
                }
                if td is not None:
                    name = f"p{p_num}-g{len(groups)}.pt"
                    with atomic_file(directory / name, "wb") as f:
                        torch.save(td, f)
                    entry["file"] = name
                groups.append(entry)
        manifest["partitions"].append(
            {
                "name": partition,
                "group_size": info.group_size,
                "consumed": {
                    t: [number[i] for i in idx if i in number] for t, idx in info.consumed.items()
                },
                "groups": groups,
            }
        )
    atomic_write(directory / "manifest.json", json.dumps(manifest, indent=1, default=str))
    return manifest


async def _dense_chunks(
    store: Store, meta: BatchMeta, members: list[int]
) -> list[tuple[list[int], Any]]:
    """``meta``'s data (on the CPU) as ``(sample numbers, TensorDict)`` chunks: one, unless a
    multi-shape dense field came back nested (its samples mix shapes); then one chunk per
    combination of those fields' per-sample shapes, each read again (dense), so that the
    load puts them back as dense parts, not as a nested field."""
    td = await store.get(meta, device="cpu")
    mixed = [
        n
        for n, s in meta.field_schemas.items()
        if s.kind == "dense" and td.get(field_key(n)).is_nested
    ]
    if not mixed:
        return [(members, td)]
    shapes = [[tuple(r.shape) for r in td.get(field_key(n)).unbind(0)] for n in mixed]
    by_shape: dict[tuple[Any, ...], list[int]] = {}
    for pos in range(meta.size):
        by_shape.setdefault(tuple(s[pos] for s in shapes), []).append(pos)
    del td
    out: list[tuple[list[int], Any]] = []
    for positions in by_shape.values():
        part = await store.get(meta.select(positions), device="cpu")
        out.append(([members[p] for p in positions], part))
    return out


@dataclass
class _Group:
    """One validated group of a partition: its sample numbers, data and put arguments."""

    samples: list[int]
    data: TensorDictBase
    keys: list[str] | None
    group_ids: list[Any] | None
    tags: list[dict[str, Any]]
    row_bytes: float  # the data's bytes per sample (what a unit must hold for each row)


@dataclass
class _Part:
    """One validated partition of a checkpoint."""

    name: str
    group_size: int | None
    consumed: dict[str, list[int]]
    groups: list[_Group]


def _field(entry: Mapping[str, Any], key: str, kind: Any, where: str) -> Any:
    if key not in entry:
        raise CheckpointError(f"{where} has no {key!r}")
    value = entry[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CheckpointError(f"{where}: {key!r} is a {type(value).__name__}, not {kind}")
    return value


def _numbers(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or any(
        not isinstance(v, int) or isinstance(v, bool) for v in value
    ):
        raise CheckpointError(f"{where} must be a list of sample numbers")
    return value


def _row_bytes(td: TensorDictBase, where: str) -> tuple[list[str], float]:
    """The field names of ``td`` and its bytes per sample (what a unit holds per row)."""
    try:
        columns = split_columns(td)
    except StoreInputError as exc:
        raise CheckpointError(f"{where} holds data the store cannot hold: {exc}") from exc
    total = 0
    for col in columns.values():
        if col.dense is not None:
            total += tensor_bytes(col.dense)
        for row in col.rows or ():
            is_tensor = isinstance(row, torch.Tensor)
            total += tensor_bytes(row) if is_tensor else estimate_plain_bytes(row)
    return sorted(columns), total / max(1, int(td.batch_size[0]))


def _load_group(directory: Path, g: Any, where: str) -> _Group:
    if not isinstance(g, Mapping):
        raise CheckpointError(f"{where} is not an object")
    samples = _numbers(_field(g, "samples", list, where), f"{where}'s samples")
    n = len(samples)
    fields = _field(g, "fields", list, where)
    if any(not isinstance(f, str) for f in fields):
        raise CheckpointError(f"{where}: 'fields' must be a list of field names")
    per_sample = {k: _field(g, k, list, where) for k in ("keys", "group_ids", "tags")}
    for k, values in per_sample.items():
        if len(values) != n:
            raise CheckpointError(f"{where}: {len(values)} {k} for {n} samples")
    tags = per_sample["tags"]
    if any(not isinstance(t, Mapping) for t in tags):
        raise CheckpointError(f"{where}: 'tags' must hold one object per sample")
    keys = per_sample["keys"]
    if any(k is not None and not isinstance(k, str) for k in keys):
        raise CheckpointError(f"{where}: 'keys' must hold a str or null per sample")
    if "file" not in g:
        raise CheckpointError(f"{where} has no 'file'")
    name = g["file"]
    if name is None:
        if fields:
            raise CheckpointError(f"{where} holds fields {fields} but names no data file")
        data: TensorDictBase = TensorDict({}, batch_size=[n])
    else:
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise CheckpointError(
                f"{where}: data file {name!r} is not a file name in the directory"
            )
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{where}: data file {str(path)!r} is missing")
        try:  # mapped, not read: the data is paged in when it is put
            data = torch.load(path, weights_only=False, mmap=True)
        except Exception as exc:  # a corrupt or foreign file: torch raises many kinds
            raise CheckpointError(f"{where}: data file {str(path)!r} does not load: {exc}") from exc
        if not isinstance(data, TensorDictBase) or data.batch_size[:1] != (n,):
            raise CheckpointError(f"{where}: data file {str(path)!r} is not a batch of {n}")
    names, row_bytes = _row_bytes(data, where)
    if name is not None and names != sorted(fields):
        raise CheckpointError(f"{where}: data file {name!r} does not hold the fields {fields}")
    groups = per_sample["group_ids"]
    return _Group(
        samples,
        data,
        keys if all(k is not None for k in keys) else None,
        None if all(x is None for x in groups) else [_group_key(x) for x in groups],
        [dict(t) for t in tags],
        row_bytes,
    )


def _metadata(metadata: Any) -> dict[str, Any]:
    """``metadata`` as a plain JSON object. Raises StoreInputError for anything else."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise StoreInputError(f"metadata must be a dict with str keys, got {metadata!r}")
    try:
        plain: dict[str, Any] = json.loads(json.dumps(dict(metadata), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise StoreInputError(f"metadata must be JSON: {exc}") from None
    return plain


def _validate(directory: Path, manifest: Any, path: Path) -> list[_Part]:
    """Every partition of ``manifest``, checked and with its data files mapped. Raises
    CheckpointError naming the first problem."""
    if not isinstance(manifest, Mapping):
        raise CheckpointError(f"{str(path)!r} is not a {FORMAT} manifest")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise CheckpointError(f"{str(path)!r} is not a {FORMAT} version {VERSION}")
    parts: list[_Part] = []
    seen: set[str] = set()
    for p_num, part in enumerate(_field(manifest, "partitions", list, str(path))):
        where = f"partition #{p_num} of {str(path)!r}"
        if not isinstance(part, Mapping):
            raise CheckpointError(f"{where} is not an object")
        name = _field(part, "name", str, where)
        where = f"partition {name!r} of {str(path)!r}"
        if not name or name in seen:
            raise CheckpointError(f"{where}: an empty or repeated partition name")
        seen.add(name)
        if "group_size" not in part:
            raise CheckpointError(f"{where} has no 'group_size'")
        group_size = part["group_size"]
        if group_size is not None and (
            not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1
        ):
            raise CheckpointError(f"{where}: group_size {group_size!r} is not null or an int >= 1")
        groups = [
            _load_group(directory, g, f"group #{g_num} of {where}")
            for g_num, g in enumerate(_field(part, "groups", list, where))
        ]
        numbers = sorted(k for g in groups for k in g.samples)
        if numbers != list(range(len(numbers))):
            raise CheckpointError(f"{where}: the groups' sample numbers are not 0..n-1 once each")
        consumed: dict[str, list[int]] = {}
        for task, done in _field(part, "consumed", Mapping, where).items():
            done = _numbers(done, f"{where}: consumed[{task!r}]")
            bad = sorted({k for k in done if not 0 <= k < len(numbers)})
            if bad:
                raise CheckpointError(
                    f"{where}: consumed[{task!r}] names samples {bad[:8]} of {len(numbers)}"
                )
            consumed[str(task)] = done
        parts.append(_Part(name, group_size, consumed, groups))
    return parts


async def _check_room(store: Store, parts: list[_Part]) -> None:
    """Raise CheckpointError unless each live unit with a capacity has room for its share of
    every group (a put gives each live unit one contiguous block of the batch)."""
    table: list[UnitView] = await store.controller.units()
    units = [u for u in table if u.alive and u.handle is not None]
    if not units or all(u.capacity_bytes is None for u in units):
        return
    stats: list[UnitStats] = await asyncio.gather(*[u.handle.stats() for u in units])
    m = len(units)
    need = [0.0] * m
    for part in parts:
        for g in part.groups:
            n = len(g.samples)
            for k in range(m):
                need[k] += (-(-(k + 1) * n // m) - -(-k * n // m)) * g.row_bytes
    for unit, stat, wanted in zip(units, stats, need, strict=True):
        capacity = unit.capacity_bytes
        if capacity is None:
            continue
        held = stat.used_bytes - stat.spare_bytes  # (spare: given up)
        free = max(0, int(capacity) - held)
        if wanted > free:
            raise CheckpointError(
                f"the checkpoint needs about {int(wanted)} bytes on unit {unit.unit_id!r}, "
                f"which has {free} of {capacity} free; nothing was written"
            )


def _read(directory: Path) -> tuple[Any, Path]:
    path = directory / "manifest.json"
    try:
        return json.loads(path.read_text()), path
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(f"no checkpoint manifest at {str(path)!r}") from exc
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"no readable checkpoint manifest at {str(path)!r}: {exc}") from exc


async def load(store: Store, directory: Path) -> Restored:
    """Restore the checkpoint in ``directory`` into ``store``; returns, per partition, the
    new global index of each saved sample (in saved order), and the saved metadata.

    Raises CheckpointNotFoundError (also a FileNotFoundError) when ``directory`` holds no
    manifest, CheckpointError (a StoreInputError; nothing written) for a foreign or
    malformed manifest, a missing or unloadable data file, a partition that already exists
    in ``store``, or units without room for the data. A failure while writing (a unit lost,
    a put refused) clears the partitions this load created and is raised as itself.
    """
    manifest, path = _read(directory)
    parts = _validate(directory, manifest, path)
    user = manifest.get("metadata", {})
    if not isinstance(user, Mapping):
        raise CheckpointError(f"{str(path)!r}: 'metadata' is not an object")
    existing = set(await store.partitions())
    clash = [p.name for p in parts if p.name in existing]
    if clash:
        raise CheckpointError(f"partitions {clash} already exist in the target store")
    await _check_room(store, parts)
    created: list[str] = []
    try:
        return Restored({p.name: await _restore(store, p, created) for p in parts}, user)
    except Exception:
        for name in created:
            with contextlib.suppress(StoreError, ActorDiedError):
                await store.clear_partition(name)
        raise


async def _restore(store: Store, part: _Part, created: list[str]) -> list[int]:
    """Put one validated partition and mark its consumed samples; returns the new indexes."""
    created.append(part.name)
    count = sum(len(g.samples) for g in part.groups)
    new_index: list[int] = [-1] * count
    where: dict[int, tuple[BatchMeta, int]] = {}
    for g in part.groups:
        meta = await store.put(
            g.data,
            part.name,
            keys=g.keys,
            group_ids=g.group_ids,
            group_size=part.group_size,
            custom_meta=g.tags,
            timeout=0,  # room was checked: a unit that is full now fails the load at once
        )
        for pos, k in enumerate(g.samples):
            new_index[k] = meta.global_indexes[pos]
            where[k] = (meta, pos)
    for task, numbers in part.consumed.items():
        if numbers:
            chosen = [where[k] for k in numbers]
            done = BatchMeta(
                store.store_id,
                tuple(m.global_indexes[p] for m, p in chosen),
                (part.name,) * len(chosen),
                tuple(m.shards[p] for m, p in chosen),
                tuple(m.generations[p] for m, p in chosen),
            )
            await store.controller.mark_consumed(task, done)
    return new_index

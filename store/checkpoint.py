"""Checkpoints of a store's partitions: save to a directory, restore into any store.

Layout::

    DIR/manifest.json          {"format": "rayless-store-checkpoint", "version": 1,
                                "store_id": ..., "partitions": [{"name", "group_size",
                                "consumed": {task: [sample numbers]}, "groups": [...]}]}
    DIR/p<i>-g<j>.pt           the data of one group of samples (those holding the same
                               fields), a TensorDict saved with torch.save

A partition's samples are numbered in allocation order; each *group* (samples with the same
ready fields) records its sample numbers, keys, group ids and tags, and its data file.
Restoring puts each group as new samples (keys, group ids, tags kept) into the target store
— whatever its unit count — then marks the consumed samples consumed per task again, so a
trainer resumes where it stopped. Samples lost with their unit or in an unfinished put are
not saved. Save while producers are quiet: a checkpoint is read partition by partition, not
as one snapshot. Loading unpickles the data files (``torch.load(weights_only=False)``):
load only checkpoints you wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rayless.store.errors import StoreInputError

if TYPE_CHECKING:
    from rayless.store.client import Store

__all__ = ["FORMAT", "load", "save"]

FORMAT = "rayless-store-checkpoint"
VERSION = 1


def _group_key(value: Any) -> Any:
    return tuple(_group_key(v) for v in value) if isinstance(value, list) else value


async def save(store: Store, directory: Path) -> dict[str, Any]:
    """Write every partition of ``store`` to ``directory`` (created; must be empty).
    Returns the manifest. Raises StoreInputError for a non-empty directory."""
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):
        raise StoreInputError(f"checkpoint directory {str(directory)!r} is not empty")
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "store_id": store.store_id,
        "partitions": [],
    }
    for p_num, partition in enumerate(await store.partitions()):
        info = await store.controller.export_partition(partition)
        samples = info["samples"]
        number = {s["index"]: k for k, s in enumerate(samples)}
        by_fields: dict[tuple[str, ...], list[int]] = {}
        for k, s in enumerate(samples):
            by_fields.setdefault(tuple(s["fields"]), []).append(k)
        groups = []
        for g_num, (fields, members) in enumerate(by_fields.items()):
            entry: dict[str, Any] = {
                "samples": members,
                "fields": list(fields),
                "keys": [samples[k]["key"] for k in members],
                "group_ids": [samples[k]["group"] for k in members],
                "tags": [samples[k]["custom"] for k in members],
                "file": None,
            }
            if fields:
                meta = await store.controller.meta_of(
                    partition, [samples[k]["index"] for k in members], list(fields)
                )
                td = await store.get(meta, device="cpu")
                name = f"p{p_num}-g{g_num}.pt"
                torch.save(td, directory / name)
                entry["file"] = name
            groups.append(entry)
        manifest["partitions"].append(
            {
                "name": partition,
                "group_size": info["group_size"],
                "consumed": {
                    t: [number[i] for i in idx if i in number]
                    for t, idx in info["consumed"].items()
                },
                "groups": groups,
            }
        )
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str))
    return manifest


async def load(store: Store, directory: Path) -> dict[str, list[int]]:
    """Restore the checkpoint in ``directory`` into ``store``; returns, per partition, the
    new global index of each saved sample (in saved order). Raises StoreInputError for a
    missing or foreign manifest or a partition that already exists in ``store``."""
    path = directory / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StoreInputError(f"no readable checkpoint manifest at {str(path)!r}: {exc}")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise StoreInputError(f"{str(path)!r} is not a {FORMAT} version {VERSION}")
    existing = set(await store.partitions())
    clash = [p["name"] for p in manifest["partitions"] if p["name"] in existing]
    if clash:
        raise StoreInputError(f"partitions {clash} already exist in the target store")
    out: dict[str, list[int]] = {}
    for part in manifest["partitions"]:
        name = part["name"]
        count = sum(len(g["samples"]) for g in part["groups"])
        new_index: list[int] = [-1] * count
        metas = {}
        for g in part["groups"]:
            n = len(g["samples"])
            if g["file"] is not None:
                td = torch.load(directory / g["file"], weights_only=False)
            else:
                from tensordict import TensorDict

                td = TensorDict({}, batch_size=[n])
            keys = g["keys"] if all(k is not None for k in g["keys"]) else None
            groups = g["group_ids"]
            meta = await store.put(
                td,
                name,
                keys=keys,
                group_ids=None
                if all(x is None for x in groups)
                else [_group_key(x) for x in groups],
                group_size=part["group_size"],
                custom_meta=g["tags"],
            )
            for k, index in zip(g["samples"], meta.global_indexes, strict=True):
                new_index[k] = index
                metas[k] = (meta, meta.global_indexes.index(index))
        for task, numbers in part["consumed"].items():
            if numbers:
                from rayless.store.meta import BatchMeta

                chosen = [metas[k] for k in numbers]
                done = BatchMeta(
                    store.store_id,
                    tuple(m.global_indexes[p] for m, p in chosen),
                    (name,) * len(chosen),
                    tuple(m.shards[p] for m, p in chosen),
                    tuple(m.generations[p] for m, p in chosen),
                )
                await store.controller.mark_consumed(task, done)
        out[name] = new_index
    return out

"""Shared by the ControllerState tests and its collaborators' tests: field schemas, a state
with units, what the units and a client do (write, put), and samples added by hand (fill)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from rayless.store.controller.allocation import Allocation
from rayless.store.controller.catalog import Catalog
from rayless.store.controller.clearing import Clearing
from rayless.store.controller.consumption import Consumption
from rayless.store.controller.kv import KeyValues
from rayless.store.controller.readiness import Readiness
from rayless.store.controller.staging import StagedPuts
from rayless.store.controller.state import ControllerState
from rayless.store.controller.units import Units
from rayless.store.data.meta import BatchMeta
from rayless.store.data.schema import DataUpdate, FieldSchema

F32 = FieldSchema("dense", "float32", (2,), "cpu")
I64 = FieldSchema("dense", "int64", (), "cpu")
RAG = FieldSchema("jagged", "int64", (None,), "cpu")
TXT = FieldSchema("non_tensor")


# What ControllerState composes; a snapshot compares their attributes, not the objects.
COLLABORATORS = (
    Allocation,
    Catalog,
    Clearing,
    Consumption,
    KeyValues,
    Readiness,
    StagedPuts,
    Units,
)


def snapshot(c: ControllerState) -> dict[str, Any]:
    """A deep copy of every attribute of ``c`` and of its collaborators (samplers aside), to
    compare before and after a call that must leave the state unchanged."""
    state: dict[str, Any] = {}
    for name, value in vars(c).items():
        if not isinstance(value, COLLABORATORS):
            state[name] = value
            continue
        for attr, inner in vars(value).items():
            if attr != "_samplers" and not isinstance(inner, COLLABORATORS):
                state[f"{name}.{attr}"] = inner
    return copy.deepcopy(state)


def state_with_units(n: int = 2) -> ControllerState:
    c = ControllerState("store-1")
    for i in range(n):
        c.register_unit(f"u{i}", node_id=f"node{i}", capacity_bytes=1 << 20)
    return c


def write(
    c: ControllerState,
    meta: BatchMeta,
    schemas: dict[str, FieldSchema],
    shapes: dict[str, list[tuple[int, ...]]] | None = None,
) -> None:
    """What the units do after writing ``meta``'s samples: notify per shard."""
    for shard, positions in meta.by_shard().items():
        idx = [meta.global_indexes[p] for p in positions]
        sub_shapes = {f: [s[p] for p in positions] for f, s in (shapes or {}).items()}
        c.on_data_update(f"u{shard}", DataUpdate(meta.partition_id, idx, schemas, sub_shapes))


def put(c: ControllerState, partition: str, n: int, **kw: Any) -> BatchMeta:
    meta = c.allocate(partition, n, schemas={"x": F32}, **kw)
    write(c, meta, {"x": F32})
    return meta


def fill(
    catalog: Catalog,
    partition: str,
    indexes: list[int],
    shards: list[int] | None = None,
    gen: int = 1,
    ready: tuple[str, ...] = (),
) -> BatchMeta:
    """Add samples ``indexes`` to ``catalog`` by hand (what allocation does, without it), on
    ``shards`` (default 0), ready for the fields ``ready`` (schema F32); returns their meta."""
    part = catalog.partitions.get(partition) or catalog.create(partition, gen)
    n = len(indexes)
    idx = np.asarray(indexes, dtype=np.int64)
    part.reserve(n)
    catalog.where.reserve(int(idx.max()) + 1)
    pos = np.arange(part.n, part.n + n)
    part.index[pos] = idx
    part.shard[pos] = shards if shards is not None else 0
    part.gen[pos] = gen
    part.flags[pos] = 0
    part.group[pos] = -1 - np.arange(n)
    part.n += n
    part.live += n
    catalog.where.part[idx] = part.code
    catalog.where.pos[idx] = pos
    for name in ready:
        part.schemas[name] = F32
        part.set_ready(name, pos)
    return catalog.meta(partition, part, pos, list(ready))

"""A get that met lost samples: the PartialResultError with the live part's data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDict

from rayless.actors import ActorDiedError
from rayless.store.data.fields import FieldSchema
from rayless.store.data.meta import BatchMeta
from rayless.store.data.rows import merge, place
from rayless.store.data.schema import assemble
from rayless.store.errors import PartialResultError, UnitLostError

__all__ = ["empty_batch", "partial_result"]


def empty_batch(schemas: Mapping[str, FieldSchema]) -> TensorDict:
    """A TensorDict of batch size 0 (on the CPU) holding every field of ``schemas`` with its
    kind, dtype and per-sample shape: the data of a get whose samples were all lost."""
    columns: dict[str, tuple[FieldSchema, Any]] = {}
    for name, schema in schemas.items():
        if schema.kind == "dense":
            shape = tuple(int(d or 0) for d in schema.shape or ())
            columns[name] = (schema, torch.empty((0, *shape), dtype=schema.torch_dtype))
        else:
            columns[name] = (schema, [])
    return assemble(0, columns)


async def partial_result(
    link: Any,
    meta: BatchMeta,
    groups: dict[tuple[int, str], list[int]],
    results: list[Any],
    lost: dict[int, str],
    device: Any,
) -> None:
    """A get that met lost samples: raise PartialResultError with the live part's data.
    ``link``: the client's :class:`~rayless.store.client.link.StoreLink` (it reports dead
    units and holds the unit table)."""
    parts: list[tuple[list[int], Any]] = []
    for ((shard, part), positions), res in zip(groups.items(), results, strict=True):
        if isinstance(res, ActorDiedError):
            res = await link.lost(shard, res)
        if isinstance(res, UnitLostError):
            lost.update({p: res.unit for p in positions})
            continue
        live = [p for p in positions if p not in lost]
        if not live:
            continue
        if isinstance(res, BaseException) or len(live) < len(positions):
            # this unit holds lost rows too (it registered again): read the live ones
            indexes = [meta.global_indexes[p] for p in live]
            res = await link.table[shard].handle.read(part, indexes, meta.field_names)
        parts.append((live, res))
    keep = sorted(p for positions, _ in parts for p in positions)
    gone = sorted(lost)
    where = {p: k for k, p in enumerate(keep)}
    schemas = meta.field_schemas
    data = (
        merge(len(keep), schemas, [([where[p] for p in ps], td) for ps, td in parts])
        if parts
        else empty_batch(schemas)
    )
    units = list(dict.fromkeys(lost[p] for p in gone))
    raise PartialResultError(
        units[0],
        f"it held {len(gone)} of the {meta.size} samples; the other {len(keep)} were read "
        "(err.data, err.meta)",
        data=place(data, schemas, device),
        meta=meta.select(keep),
        lost=meta.select(gone),
        units=units,
    )

"""A get that met lost samples: the PartialResultError with the live part's data."""

from __future__ import annotations

from typing import Any

from tensordict import TensorDict

from rayless.actors import ActorDiedError
from rayless.store.errors import PartialResultError, UnitLostError
from rayless.store.meta import BatchMeta
from rayless.store.rows import merge, place

__all__ = ["partial_result"]


async def partial_result(
    store: Any,
    meta: BatchMeta,
    groups: dict[tuple[int, str], list[int]],
    results: list[Any],
    lost: dict[int, str],
    device: Any,
) -> None:
    """A get that met lost samples: raise PartialResultError with the live part's data."""
    parts: list[tuple[list[int], Any]] = []
    for ((shard, part), positions), res in zip(groups.items(), results, strict=True):
        if isinstance(res, ActorDiedError):
            res = await store._lost(shard, res)
        if isinstance(res, UnitLostError):
            lost.update({p: res.unit for p in positions})
            continue
        live = [p for p in positions if p not in lost]
        if not live:
            continue
        if isinstance(res, BaseException) or len(live) < len(positions):
            # this unit holds lost rows too (it registered again): read the live ones
            indexes = [meta.global_indexes[p] for p in live]
            res = await store.units[shard]["handle"].read(part, indexes, meta.field_names)
        parts.append((live, res))
    keep = sorted(p for positions, _ in parts for p in positions)
    gone = sorted(lost)
    where = {p: k for k, p in enumerate(keep)}
    schemas = meta.field_schemas
    data = (
        merge(len(keep), schemas, [([where[p] for p in ps], td) for ps, td in parts])
        if parts
        else TensorDict({}, batch_size=[0])
    )
    units = list(dict.fromkeys(lost[p] for p in gone))
    raise PartialResultError(
        units[0],
        f"it held {len(gone)} of the {meta.size} samples; the other {len(keep)} were read "
        "(err.data, err.meta)",
        data=place(data, schemas, device) if parts else data,  # (all lost: empty)
        meta=meta.select(keep),
        lost=meta.select(gone),
        units=units,
    )

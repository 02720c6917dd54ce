"""The data update a storage unit sends the controller after a write, and per-sample shapes
on the wire.

:class:`DataUpdate` travels as a codec extension (``rayless.store.data_update``) of its
checked plain form (``to_dict``/``from_dict``: StoreInputError for a malformed one);
:func:`shapes_to_wire` packs per-sample shapes into one flat list when they share a rank
(:func:`shapes_from_wire`, :func:`known_shapes` rebuild them).
:mod:`rayless.store.data.schema` re-exports everything here.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayless.store.data.fields import FieldSchema
from rayless.store.errors import StoreInputError

__all__ = ["DataUpdate", "known_shapes", "shapes_from_wire", "shapes_to_wire"]


@dataclass
class DataUpdate:
    """What a storage unit tells the controller after a write (and waits on the ACK for).

    ``schemas`` holds the written fields; ``sample_shapes`` the per-sample shapes of the nested
    fields among them, aligned with ``indexes``. ``generation``: the allocation serial of a
    new put's samples (``BatchMeta.generations``), which the controller checks, so a write of
    samples cleared meanwhile (their indexes maybe reused) is refused; None: not checked.
    """

    partition: str
    indexes: list[int]
    schemas: dict[str, FieldSchema]
    sample_shapes: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    put_id: int | None = (
        None  # a column-wise put's id (store.controller.column_puts), None otherwise
    )
    generation: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the wire."""
        return {
            "partition": self.partition,
            "indexes": list(self.indexes),
            "schemas": {k: v.to_dict() for k, v in self.schemas.items()},
            "sample_shapes": {k: shapes_to_wire(v) for k, v in self.sample_shapes.items()},
            "put_id": self.put_id,
            "generation": self.generation,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DataUpdate:
        """Rebuild from :meth:`to_dict`'s output. Raises StoreInputError on malformed input."""
        try:
            return cls(
                partition=str(data["partition"]),
                indexes=_ints(data["indexes"]),
                schemas={str(k): FieldSchema.from_dict(v) for k, v in data["schemas"].items()},
                sample_shapes={
                    str(k): known_shapes(v) for k, v in (data.get("sample_shapes") or {}).items()
                },
                put_id=_put_id(data.get("put_id")),
                generation=_put_id(data.get("generation"), "generation"),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            if isinstance(exc, StoreInputError):
                raise
            raise StoreInputError(f"malformed data update: {exc!r}")


def _ints(values: Any) -> list[int]:
    """``values`` as a list of ints (one C-level type pass for the usual list of ints)."""
    if isinstance(values, list) and set(map(type, values)) <= {int}:
        return list(values)
    return [int(i) for i in values]


def _put_id(value: Any, what: str = "put_id") -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise StoreInputError(f"a data update's {what} must be an int, got {value!r}")
    return value


def shapes_to_wire(shapes: Sequence[Any]) -> Any:
    """Per-sample shapes for the wire: ``{"rank": r, "n": n, "dims": [flat]}`` when all are
    known and of one rank (one list instead of one per sample), else a list of lists (None:
    unknown)."""
    if shapes and all(s is not None for s in shapes):
        rank = len(shapes[0])
        if all(len(s) == rank for s in shapes):
            return {"rank": rank, "n": len(shapes), "dims": list(itertools.chain(*shapes))}
    return [None if s is None else list(s) for s in shapes]


def shapes_from_wire(value: Any) -> tuple[tuple[int, ...] | None, ...]:
    """Rebuild :func:`shapes_to_wire`'s output. Raises StoreInputError when malformed."""
    if isinstance(value, dict):
        rank, n, dims = value.get("rank"), value.get("n"), value.get("dims")
        if not (type(rank) is int and type(n) is int and rank >= 0 and n >= 0):
            raise StoreInputError("malformed sample shapes")
        if not isinstance(dims, list) or len(dims) != rank * n:
            raise StoreInputError("malformed sample shapes")
        if not all(type(d) is int and d >= 0 for d in dims):
            raise StoreInputError("malformed sample shapes: dims must be ints >= 0")
        if rank == 0:
            return ((),) * n
        return tuple(zip(*[iter(dims)] * rank, strict=True))
    if not isinstance(value, list):
        raise StoreInputError("malformed sample shapes")
    return tuple(None if s is None else tuple(int(d) for d in s) for s in value)


def known_shapes(value: Any) -> list[tuple[int, ...]]:
    """:func:`shapes_from_wire` where every shape must be known (a data update's)."""
    shapes = shapes_from_wire(value)
    if any(s is None for s in shapes):
        raise StoreInputError("a data update's sample shapes must all be known")
    return list(shapes)  # type: ignore[arg-type]


def _register_wire() -> None:
    from rayless.transport import register_extension

    register_extension(
        DataUpdate, "rayless.store.data_update", DataUpdate.to_dict, DataUpdate.from_dict
    )


_register_wire()

"""The column kinds of a shard: dense slots of one growable tensor, and one entry per sample.

A dense field is a :class:`~rayless.store.data.dense.DenseColumn` (slots of one growable
tensor). :class:`_Rows` holds a nested or non-tensor field as one entry per sample with its
size in bytes. :class:`_Parts` holds a *multi-shape* dense field (puts of different per-sample
shapes): one :class:`DenseColumn` part per shape, each sample's row in the part of its shape;
rows never move between parts. :class:`~rayless.store.unit.shard.ShardStorage` keeps one of
these per partition x field (a field is a plain :class:`DenseColumn` until a put of another
shape arrives).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from rayless.store.data.dense import DenseColumn
from rayless.store.data.schema import (
    Column,
    FieldSchema,
    estimate_plain_bytes,
    nest_rows,
    tensor_bytes,
)

__all__: list[str] = []


class _Rows:
    """A nested or non-tensor column: one entry per sample."""

    def __init__(self, schema: FieldSchema) -> None:
        self.schema = schema
        self.rows: dict[int, Any] = {}
        self.sizes: dict[int, int] = {}
        self.nbytes = 0

    def write(self, indexes: Sequence[int], rows: Sequence[Any], sizes: Sequence[int]) -> None:
        for i, row, size in zip(indexes, rows, sizes, strict=True):
            self.nbytes += size - self.sizes.get(i, 0)
            self.rows[i] = row
            self.sizes[i] = size

    def delete(self, indexes: Iterable[int]) -> None:
        for i in indexes:
            if i in self.rows:
                del self.rows[i]
                self.nbytes -= self.sizes.pop(i)

    def __contains__(self, index: int) -> bool:
        return index in self.rows

    def holds_any(self, indexes: Iterable[int]) -> bool:
        """Whether any of ``indexes`` has a row here (one C-level pass)."""
        return not self.rows.keys().isdisjoint(indexes)

    def __len__(self) -> int:
        return len(self.rows)


class _Parts:
    """A multi-shape dense field: a dense column part per per-sample shape (``parts``).

    A sample's row lives in exactly one part (the one of its shape; a write of another shape
    deletes it from the part it was in). A part left without rows is dropped (closed). Reads
    of samples of one part are that part's dense read; a read mixing parts is a nested tensor
    (:func:`~rayless.store.data.schema.nest_rows`)."""

    def __init__(self, schema: FieldSchema, parts: dict[tuple[int, ...], DenseColumn]) -> None:
        self.schema = schema  # the field's (merged) schema: None where the parts' shapes differ
        self.parts = parts

    @staticmethod
    def shape_of(col: DenseColumn) -> tuple[int, ...]:
        return tuple(int(d) for d in col.data.shape[1:])

    def part_of(self, index: int) -> DenseColumn | None:
        """The part holding ``index``'s row (None: none)."""
        for part in self.parts.values():
            if index in part:
                return part
        return None

    def groups(self, indexes: Sequence[int]) -> list[tuple[DenseColumn, list[int]]]:
        """``(part, positions in indexes)`` for each part holding some of ``indexes``, in the
        parts' order. Raises KeyError for an index no part holds."""
        left = {i: k for k, i in enumerate(indexes)}
        out: list[tuple[DenseColumn, list[int]]] = []
        for part in self.parts.values():  # (set intersections: O(indexes), not x parts)
            hit = part.slot_of.keys() & left.keys()
            if hit:
                out.append((part, sorted(left.pop(i) for i in hit)))
        if left:
            raise KeyError(next(iter(left)))
        return out

    def read(self, indexes: Sequence[int]) -> torch.Tensor:
        """The rows: dense when they sit in one part, else a nested tensor in index order."""
        groups = self.groups(indexes)
        if len(groups) == 1:
            return groups[0][0].read(indexes)
        rows: list[Any] = [None] * len(indexes)
        for part, at in groups:
            for k, row in zip(at, part.read([indexes[k] for k in at]).unbind(0), strict=True):
                rows[k] = row
        return nest_rows(rows, self.schema)

    def drop_empty(self) -> None:
        """Close the parts left without rows (or pending reservations)."""
        for shape in [s for s, p in self.parts.items() if not len(p)]:
            _close(self.parts.pop(shape))

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts.values())

    @property
    def pending(self) -> int:
        return sum(getattr(p, "pending", 0) for p in self.parts.values())

    def delete(self, indexes: Iterable[int]) -> None:
        idx = list(indexes)
        for part in self.parts.values():
            part.delete(idx)
        self.drop_empty()

    def close(self) -> None:
        for part in self.parts.values():
            _close(part)
        self.parts.clear()

    def __contains__(self, index: int) -> bool:
        return any(index in p for p in self.parts.values())

    def holds_any(self, indexes: Iterable[int]) -> bool:
        idx = indexes if isinstance(indexes, (list, tuple, set, range)) else list(indexes)
        return any(p.holds_any(idx) for p in self.parts.values())

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts.values())


def _dims(shape: Sequence[int | None]) -> tuple[int, ...]:
    """A concrete per-sample shape (a put's: no ``None``) as ints."""
    return tuple(0 if d is None else int(d) for d in shape)


def dense_part(col: Any, shape: Sequence[int | None]) -> DenseColumn | None:
    """The dense column (part) of field column ``col`` that holds rows of per-sample ``shape``
    (None: none yet, or ``col`` is not dense)."""
    if isinstance(col, _Parts):
        return col.parts.get(_dims(shape))
    if isinstance(col, DenseColumn) and _Parts.shape_of(col) == _dims(shape):
        return col
    return None


def with_part(
    col: Any, part: DenseColumn, schema: FieldSchema | None = None
) -> DenseColumn | _Parts:
    """Field column ``col`` (a dense column, parts, or None) with ``part`` among its parts, and
    ``schema`` (the merged one; None: merged here) as the field's: ``part`` itself when it is
    the only one."""
    shape = _Parts.shape_of(part)
    if col is None or col is part:
        return part
    if schema is None:
        schema = col.schema.merged(part.schema, "")
    if isinstance(col, _Parts):
        col.parts.setdefault(shape, part)
        col.schema = schema
        return col
    assert isinstance(col, DenseColumn)
    return _Parts(schema, {_Parts.shape_of(col): col, shape: part})


def part_schema(schema: FieldSchema, shape: Sequence[int | None]) -> FieldSchema:
    """The schema of a field's column part of per-sample ``shape`` (``schema``: the field's)."""
    return FieldSchema("dense", schema.dtype, _dims(shape), schema.device)


_Col = DenseColumn | _Rows | _Parts


def _close(col: Any) -> None:
    """Give a dropped column's memory back (a shared-memory column unlinks its segment)."""
    close = getattr(col, "close", None)
    if close is not None:
        close()


def _row_sizes(column: Column) -> list[int]:
    if column.schema.is_non_tensor:
        return [estimate_plain_bytes(v) for v in column.rows or ()]
    return [tensor_bytes(r) for r in column.rows or ()]

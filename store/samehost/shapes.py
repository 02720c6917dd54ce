"""Multi-shape dense fields on the same-host plane: what a get copies for each per-sample shape.

A dense field put with several per-sample shapes keeps one column part per shape on each unit
(:class:`~rayless.store.unit.columns._Parts`); ``locate`` answers for such a field where its
rows are, per part (``{"parts": [{..., "shape", "at"}]}`` when a unit's rows mix parts, else
the usual answer with its ``"shape"``). :func:`plan` turns the units' answers into copies:

* all of a get's rows of the field in parts of one shape: the field is copied as ever, into one
  dense tensor of that shape (one copy per byte; the schema the copies use gets that shape);
* rows of several shapes: one *piece* per shape (a dense tensor of that shape holding the rows
  of that shape, in batch order) copied like a field of its own (entries carry ``"to"``: the
  rows' places in the piece); :func:`nest` then builds the field's nested tensor from the
  pieces (jagged when the shapes differ only in their first dimension, else strided).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rayless.store.data.schema import FieldSchema, nest_rows

__all__ = ["Plan", "nest", "plan"]


class Plan:
    """The copies of a get's dense fields: ``schemas`` (the meta's, with each copied name's
    concrete shape), ``names`` (what to allocate and copy: fields, and pieces of mixed
    fields), ``rows`` (a piece's row count; fields have the batch's), ``pieces`` (per mixed
    field: per piece name, the batch positions of its rows in order)."""

    def __init__(self) -> None:
        self.schemas: dict[str, FieldSchema] = {}
        self.names: list[str] = []
        self.rows: dict[str, int] = {}
        self.pieces: dict[str, dict[str, list[int]]] = {}


def _shape(where: Mapping[str, Any], schema: FieldSchema) -> tuple[int, ...]:
    return tuple(int(d or 0) for d in where.get("shape", schema.shape or ()))


def plan(
    schemas: Mapping[str, FieldSchema],
    dense: Sequence[str],
    located: list[dict[str, Any]],
    positions: Sequence[Sequence[int]],
) -> Plan | None:
    """The copies for ``located`` (the units' ``locate`` answers, whose ``"fields"`` are
    rewritten here for mixed fields: one entry per piece instead of the field's) of the
    batch positions ``positions`` (per unit, in ``located``'s order). None: a shape the meta
    does not know (the socket path tells what happened)."""
    out = Plan()
    out.schemas = dict(schemas)
    for name in dense:
        schema = schemas[name]
        entries: list[tuple[int, dict[str, Any]]] = []
        for g, found in enumerate(located):
            where = found["fields"][name]
            entries.extend((g, w) for w in where.get("parts", [where]))
        shapes = list(dict.fromkeys(_shape(w, schema) for _, w in entries))
        if not schema.is_multi_shape:
            if any(s != tuple(schema.shape or ()) for s in shapes):
                return None
            out.names.append(name)
            continue
        if len(shapes) <= 1:
            if shapes:
                out.schemas[name] = FieldSchema("dense", schema.dtype, shapes[0], schema.device)
            out.names.append(name)
            continue
        piece = {s: f"{name}\x00{k}" for k, s in enumerate(shapes)}
        batch: dict[str, list[int]] = {p: [] for p in piece.values()}
        for found in located:
            del found["fields"][name]
        for g, w in entries:
            shape = _shape(w, schema)
            key = piece[shape]
            at = w.get("at", range(len(positions[g])))
            start = len(batch[key])
            batch[key].extend(positions[g][k] for k in at)
            located[g]["fields"][key] = {**w, "to": list(range(start, len(batch[key])))}
            out.schemas[key] = FieldSchema("dense", schema.dtype, shape, schema.device)
        for key, rows in batch.items():
            out.names.append(key)
            out.rows[key] = len(rows)
        out.pieces[name] = batch
    return out


def nest(
    size: int,
    schema: FieldSchema,
    pieces: Mapping[str, Sequence[int]],
    out: dict[str, torch.Tensor],
) -> torch.Tensor:
    """A mixed field's nested tensor from its pieces in ``out`` (removed from it)."""
    rows: list[Any] = [None] * size
    for key, where in pieces.items():
        for p, row in zip(where, out.pop(key).unbind(0), strict=True):
            rows[p] = row
    return nest_rows(rows, schema)

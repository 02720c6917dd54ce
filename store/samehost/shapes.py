"""Multi-shape dense fields on the same-host plane: what a get copies for each per-sample shape.

A dense field put with several per-sample shapes keeps one column part per shape on each unit
(:class:`~rayless.store.unit.columns._Parts`); ``locate`` answers for such a field where its
rows are, one :class:`~rayless.store.data.messages.Place` per part (with ``at``: the rows'
positions, when a unit's rows mix parts; each with its ``shape``). :func:`plan` turns the
units' answers into copies:

* all of a get's rows of the field in parts of one shape: the field is copied as ever, into one
  dense tensor of that shape (one copy per byte; the schema the copies use gets that shape);
* rows of several shapes: one *piece* per shape (a dense tensor of that shape holding the rows
  of that shape, in batch order) copied like a field of its own (its places carry ``to``: the
  rows' places in the piece); :func:`nest` then builds the field's nested tensor from the
  pieces (jagged when the shapes differ only in their first dimension, else strided).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from rayless.store.data.messages import Located, Place
from rayless.store.data.schema import FieldSchema, nest_rows

__all__ = ["Plan", "nest", "plan"]


class Plan:
    """The copies of a get's dense fields: ``schemas`` (the meta's, with each copied name's
    concrete shape), ``names`` (what to allocate and copy: fields, and pieces of mixed
    fields), ``rows`` (a piece's row count; fields have the batch's), ``pieces`` (per mixed
    field: per piece name, the batch positions of its rows in order), ``places`` (per unit,
    in the order located: where each copied name's rows are)."""

    def __init__(self) -> None:
        self.schemas: dict[str, FieldSchema] = {}
        self.names: list[str] = []
        self.rows: dict[str, int] = {}
        self.pieces: dict[str, dict[str, list[int]]] = {}
        self.places: list[dict[str, Place]] = []


def plan(
    schemas: Mapping[str, FieldSchema],
    dense: Sequence[str],
    located: Sequence[Located],
    positions: Sequence[Sequence[int]],
) -> Plan | None:
    """The copies for ``located`` (the units' ``locate`` answers) of the batch positions
    ``positions`` (per unit, in ``located``'s order): a field of one shape is copied from
    its one place on each unit, a mixed field's pieces from theirs (with ``to`` set). None:
    a shape the meta does not know, or an answer without a field asked (the socket path
    tells what happened)."""
    out = Plan()
    out.schemas = dict(schemas)
    out.places = [{} for _ in located]
    for name in dense:
        schema = schemas[name]
        entries: list[tuple[int, Place]] = []
        for g, found in enumerate(located):
            where = found.fields.get(name)
            if not where:
                return None
            entries.extend((g, w) for w in where)
        shapes = list(dict.fromkeys(tuple(w.shape) for _, w in entries))
        if not schema.is_multi_shape or len(shapes) <= 1:
            if not schema.is_multi_shape and any(s != tuple(schema.shape or ()) for s in shapes):
                return None
            if len(entries) != len(located):
                return None  # (one shape: one place per unit)
            if schema.is_multi_shape and shapes:
                out.schemas[name] = FieldSchema("dense", schema.dtype, shapes[0], schema.device)
            for g, w in entries:
                out.places[g][name] = w
            out.names.append(name)
            continue
        piece = {s: f"{name}\x00{k}" for k, s in enumerate(shapes)}
        batch: dict[str, list[int]] = {p: [] for p in piece.values()}
        for g, w in entries:
            shape = tuple(w.shape)
            key = piece[shape]
            at = w.at if w.at is not None else range(len(positions[g]))
            start = len(batch[key])
            batch[key].extend(positions[g][k] for k in at)
            out.places[g][key] = replace(w, to=list(range(start, len(batch[key]))))
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

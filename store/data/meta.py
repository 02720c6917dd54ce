"""BatchMeta: the handle to a batch of samples in the store, without their data.

The controller hands out BatchMeta (on put and on get_meta); clients pass it back to read,
extend (put new fields onto the same samples) or clear the samples. It holds plain values
only and travels as a dict (``to_dict``/``from_dict``).

Per sample it holds the global index, the partition, the shard (storage unit number) that
holds the sample's row, the allocation serial (``generations``: tells a sample apart from a
later one that reuses its index, so a stale meta is refused) and custom metadata. Per field it
holds the schema and, for nested (ragged) fields, each sample's shape where known.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rayless.store.data.fields import FieldSchema
from rayless.store.data.plain import check_plain
from rayless.store.data.updates import shapes_from_wire, shapes_to_wire
from rayless.store.errors import ForeignMetaError, StoreInputError, UnknownFieldError

__all__ = ["BatchMeta"]

SampleShape = tuple[int, ...] | None


class _NoCustom(dict[str, Any]):
    """The custom metadata of a sample that has none: one shared, read-only empty dict (a
    1,024-sample meta then allocates no 1,024 dicts). Mutating it raises TypeError."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "a sample without custom metadata has a shared read-only {}; "
            "use BatchMeta.with_custom_meta (or Store.set_custom_meta) to set some"
        )

    __setitem__ = __delitem__ = __ior__ = update = setdefault = _refuse
    pop = popitem = clear = _refuse

    def __reduce__(self) -> Any:
        return (_no_custom, ())

    def __copy__(self) -> _NoCustom:
        return self

    def __deepcopy__(self, memo: Any) -> _NoCustom:
        return self


def _no_custom() -> _NoCustom:
    return NO_CUSTOM


def _copy(custom: dict[str, Any]) -> dict[str, Any]:
    return custom if custom is NO_CUSTOM else dict(custom)


NO_CUSTOM = _NoCustom()


@dataclass(frozen=True)
class BatchMeta:
    """Metadata of a batch of samples: indexes, partitions, shards, field schemas, custom meta.

    Construct it through the controller; the constructor checks that the per-sample tuples
    have one entry per sample and raises StoreInputError otherwise.
    """

    store_id: str
    global_indexes: tuple[int, ...]
    partition_ids: tuple[str, ...]
    shards: tuple[int, ...]
    generations: tuple[int, ...]
    field_schemas: Mapping[str, FieldSchema] = field(default_factory=dict)
    custom_meta: tuple[dict[str, Any], ...] = ()
    sample_shapes: Mapping[str, tuple[SampleShape, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.global_indexes)
        if not self.custom_meta and n:
            object.__setattr__(self, "custom_meta", (NO_CUSTOM,) * n)
        for name in ("partition_ids", "shards", "generations", "custom_meta"):
            if len(getattr(self, name)) != n:
                raise StoreInputError(f"BatchMeta.{name} must have one entry per sample ({n})")
        for fname, shapes in self.sample_shapes.items():
            if fname not in self.field_schemas or len(shapes) != n:
                raise StoreInputError(f"BatchMeta.sample_shapes[{fname!r}] does not fit the batch")
        if (
            len(set(self.global_indexes)) != n
            and len(set(zip(self.partition_ids, self.global_indexes, strict=True))) != n
        ):  # unique indexes: unique samples (the cheap check first)
            raise StoreInputError("a BatchMeta names a sample more than once")

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The global indexes, shards and generations as int64 arrays (made once; a meta
        from the wire has them from its runs). Raises StoreInputError for values that are not
        ints."""
        cached: tuple[np.ndarray, np.ndarray, np.ndarray] | None = self.__dict__.get("_arrays")
        if cached is None:
            cached = (
                _int_array(self.global_indexes),
                _int_array(self.shards),
                _int_array(self.generations),
            )
            object.__setattr__(self, "_arrays", cached)
        return cached

    # -- views ---------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of samples."""
        return len(self.global_indexes)

    def __len__(self) -> int:
        return len(self.global_indexes)

    @property
    def field_names(self) -> list[str]:
        """Names of the fields this meta covers (dotted paths for nested TensorDicts)."""
        return list(self.field_schemas)

    @property
    def partition_id(self) -> str:
        """The one partition of all samples. Raises StoreInputError for mixed or empty metas."""
        parts = set(self.partition_ids)
        if len(parts) != 1:
            raise StoreInputError(f"the batch spans {len(parts)} partitions, not exactly one")
        return next(iter(parts))

    def by_shard(self) -> dict[int, list[int]]:
        """Positions of the samples grouped by shard, shards in ascending order."""
        groups: dict[int, list[int]] = {}
        for pos, shard in enumerate(self.shards):
            groups.setdefault(shard, []).append(pos)
        return dict(sorted(groups.items()))

    def by_partition(self) -> dict[str, list[int]]:
        """Global indexes grouped by partition (first-seen order)."""
        groups: dict[str, list[int]] = {}
        for part, index in zip(self.partition_ids, self.global_indexes, strict=True):
            groups.setdefault(part, []).append(index)
        return groups

    # -- derived metas -------------------------------------------------------------------

    def select(self, positions: Sequence[int]) -> BatchMeta:
        """The samples at ``positions`` (in that order). Raises StoreInputError if out of range."""
        n = self.size
        pos = list(positions)
        if any(not isinstance(p, int) or not 0 <= p < n for p in pos):
            raise StoreInputError(f"positions out of range for a batch of {n}")
        return BatchMeta(
            self.store_id,
            tuple(self.global_indexes[p] for p in pos),
            tuple(self.partition_ids[p] for p in pos),
            tuple(self.shards[p] for p in pos),
            tuple(self.generations[p] for p in pos),
            dict(self.field_schemas),
            tuple(_copy(self.custom_meta[p]) for p in pos),
            {k: tuple(v[p] for p in pos) for k, v in self.sample_shapes.items()},
        )

    def select_fields(self, names: Iterable[str]) -> BatchMeta:
        """The same samples restricted to fields ``names``. Raises UnknownFieldError."""
        wanted = list(dict.fromkeys(names))
        unknown = [n for n in wanted if n not in self.field_schemas]
        if unknown:
            raise UnknownFieldError(f"fields {unknown} are not in this meta ({self.field_names})")
        return replace(
            self,
            field_schemas={n: self.field_schemas[n] for n in wanted},
            sample_shapes={k: v for k, v in self.sample_shapes.items() if k in wanted},
        )

    def split(self, chunk_size: int) -> list[BatchMeta]:
        """Consecutive pieces of ``chunk_size`` samples (the last may be shorter)."""
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise StoreInputError(f"chunk_size must be a positive int, got {chunk_size!r}")
        return [
            self.select(range(i, min(i + chunk_size, self.size)))
            for i in range(0, self.size, chunk_size)
        ]

    def chunk(self, n: int) -> list[BatchMeta]:
        """``n`` consecutive pieces whose sizes differ by at most one (e.g. one per DP rank)."""
        if not isinstance(n, int) or n <= 0:
            raise StoreInputError(f"n must be a positive int, got {n!r}")
        base, extra = divmod(self.size, n)
        out, start = [], 0
        for i in range(n):
            stop = start + base + (1 if i < extra else 0)
            out.append(self.select(range(start, stop)))
            start = stop
        return out

    @classmethod
    def concat(cls, metas: Sequence[BatchMeta]) -> BatchMeta:
        """One meta with the samples of all ``metas`` in order.

        All must come from the same store (ForeignMetaError) and cover the same fields
        (StoreInputError); a sample may appear only once.
        """
        if not metas:
            raise StoreInputError("concat needs at least one BatchMeta")
        first = metas[0]
        for m in metas[1:]:
            if m.store_id != first.store_id:
                raise ForeignMetaError("cannot concat metas of different stores")
            if set(m.field_schemas) != set(first.field_schemas):
                raise StoreInputError("cannot concat metas with different fields")
        shapes: dict[str, tuple[SampleShape, ...]] = {}
        for name in first.field_schemas:
            if any(name in m.sample_shapes for m in metas):
                shapes[name] = tuple(
                    s for m in metas for s in m.sample_shapes.get(name, (None,) * m.size)
                )
        return cls(
            first.store_id,
            tuple(i for m in metas for i in m.global_indexes),
            tuple(p for m in metas for p in m.partition_ids),
            tuple(s for m in metas for s in m.shards),
            tuple(g for m in metas for g in m.generations),
            dict(first.field_schemas),
            tuple(_copy(c) for m in metas for c in m.custom_meta),
            shapes,
        )

    def with_fields(
        self,
        schemas: Mapping[str, FieldSchema],
        sample_shapes: Mapping[str, Sequence[SampleShape]] | None = None,
    ) -> BatchMeta:
        """This meta with fields ``schemas`` added (or replaced), e.g. after ``put(td, meta)``."""
        shapes = dict(self.sample_shapes)
        for name in schemas:
            shapes.pop(name, None)
        for name, per_sample in (sample_shapes or {}).items():
            shapes[name] = tuple(per_sample)
        return replace(self, field_schemas={**self.field_schemas, **schemas}, sample_shapes=shapes)

    def with_custom_meta(self, custom_meta: Sequence[Mapping[str, Any]]) -> BatchMeta:
        """This meta with per-sample custom metadata replaced (plain, msgpack-able values)."""
        if len(custom_meta) != self.size:
            raise StoreInputError(f"custom_meta needs one dict per sample ({self.size})")
        for i, item in enumerate(custom_meta):
            if not isinstance(item, Mapping):
                raise StoreInputError(f"custom_meta[{i}] is not a dict")
            check_plain(dict(item), f"custom_meta[{i}]")
        return replace(
            self,
            field_schemas=dict(self.field_schemas),
            custom_meta=tuple(dict(c) for c in custom_meta),
            sample_shapes=dict(self.sample_shapes),
        )

    # -- wire ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the wire: per-sample columns as runs (a put's 1,024 samples are a
        few numbers, not 5,120 values), custom metadata only where a sample has some."""
        custom = [dict(c) for c in self.custom_meta] if any(self.custom_meta) else []
        return {
            "store_id": self.store_id,
            "n": self.size,
            "index_spans": _spans(self.global_indexes),
            "partition_runs": _runs(self.partition_ids),
            "shard_runs": _runs(self.shards),
            "generation_runs": _runs(self.generations),
            "field_schemas": {k: v.to_dict() for k, v in self.field_schemas.items()},
            "custom_meta": custom,
            "sample_shapes": {k: shapes_to_wire(v) for k, v in self.sample_shapes.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchMeta:
        """Rebuild from :meth:`to_dict`'s output (or the plain per-sample lists of earlier
        versions). Raises StoreInputError on malformed input (a forged run that would expand
        past MAX_SAMPLES samples included)."""
        try:
            if "index_spans" in data:
                n = int(data["n"])
                if not 0 <= n <= MAX_SAMPLES:
                    raise StoreInputError(f"a BatchMeta of {n} samples (at most {MAX_SAMPLES})")
                idx_arr = _unspan(data["index_spans"], n)
                parts = _unrun(data["partition_runs"], n, str)
                shard_arr = _unrun_ints(data["shard_runs"], n)
                gen_arr = _unrun_ints(data["generation_runs"], n)
                indexes = tuple(idx_arr.tolist())
                shards = tuple(shard_arr.tolist())
                gens = tuple(gen_arr.tolist())
                arrays = (idx_arr, shard_arr, gen_arr)
            else:
                indexes = tuple(int(i) for i in data["global_indexes"])
                parts = tuple(str(p) for p in data["partition_ids"])
                shards = tuple(int(s) for s in data["shards"])
                gens = tuple(int(g) for g in data["generations"])
                arrays = None
            meta = cls(
                str(data["store_id"]),
                indexes,
                parts,
                shards,
                gens,
                {str(k): FieldSchema.from_dict(v) for k, v in data["field_schemas"].items()},
                tuple(dict(c) for c in data.get("custom_meta") or ()),
                {str(k): shapes_from_wire(v) for k, v in (data.get("sample_shapes") or {}).items()},
            )
            if arrays is not None:
                object.__setattr__(meta, "_arrays", arrays)
            return meta
        except StoreInputError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise StoreInputError(f"malformed BatchMeta: {exc!r}")


MAX_SAMPLES = 1 << 26  # samples one wire BatchMeta may expand to


def _spans(values: Sequence[int]) -> list[int]:
    """``[start, length, start, length, ...]`` of the runs of consecutive ints in ``values``."""
    t = tuple(values)
    if t and t[-1] - t[0] == len(t) - 1 and t == tuple(range(t[0], t[-1] + 1)):
        return [t[0], len(t)]  # the common case, checked at C speed
    out: list[int] = []
    start = prev = None
    for v in values:
        if prev is not None and v == prev + 1:
            prev = v
            continue
        if start is not None and prev is not None:
            out += (start, prev - start + 1)
        start = prev = v
    if start is not None and prev is not None:
        out += (start, prev - start + 1)
    return out


def _runs(values: Sequence[Any]) -> list[Any]:
    """``[value, count, value, count, ...]`` of the runs of equal values in ``values``."""
    t = tuple(values)
    if t and t.count(t[0]) == len(t):
        return [t[0], len(t)]  # one run, counted at C speed
    out: list[Any] = []
    for v in values:
        if out and out[-2] == v:
            out[-1] += 1
        else:
            out += (v, 1)
    return out


def _pairs(flat: Sequence[Any], n: int) -> list[tuple[Any, int]]:
    if not isinstance(flat, (list, tuple)) or len(flat) % 2:
        raise StoreInputError("malformed BatchMeta: a run list needs value, count pairs")
    pairs = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
    if any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for _, c in pairs):
        raise StoreInputError("malformed BatchMeta: a run's count must be an int >= 1")
    if sum(c for _, c in pairs) != n:
        raise StoreInputError(f"malformed BatchMeta: the runs do not cover its {n} samples")
    return pairs


def _unspan(flat: Sequence[Any], n: int) -> np.ndarray:
    pairs = _pairs(flat, n)
    for start, _ in pairs:
        if not isinstance(start, int) or isinstance(start, bool):
            raise StoreInputError("malformed BatchMeta: a span's start must be an int")
    if not pairs:
        return np.empty(0, dtype=np.int64)
    try:
        return np.concatenate([np.arange(s, s + k, dtype=np.int64) for s, k in pairs])
    except OverflowError:
        raise StoreInputError("malformed BatchMeta: a span is out of range")


def _unrun_ints(flat: Sequence[Any], n: int) -> np.ndarray:
    pairs = _pairs(flat, n)
    values = [v for v, _ in pairs]
    if set(map(type, values)) - {int}:
        raise StoreInputError("malformed BatchMeta: a run holds a value that is not an int")
    try:
        return np.repeat(
            np.asarray(values, dtype=np.int64), np.asarray([c for _, c in pairs], dtype=np.int64)
        )
    except OverflowError:
        raise StoreInputError("malformed BatchMeta: a run's value is out of range")


def _int_array(values: Sequence[Any]) -> np.ndarray:
    """``values`` (ints) as an int64 array. Raises StoreInputError for anything else."""
    if set(map(type, values)) - {int, np.int64}:
        raise StoreInputError("a BatchMeta's indexes, shards and generations must be ints")
    try:
        return np.asarray(values, dtype=np.int64).reshape(-1)
    except OverflowError:
        raise StoreInputError("a BatchMeta's index, shard or generation is out of range")


def _unrun(flat: Sequence[Any], n: int, kind: type | None = None) -> tuple[Any, ...]:
    out: list[Any] = []
    for value, count in _pairs(flat, n):
        if kind is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise StoreInputError(f"malformed BatchMeta: a run holds {value!r} ({kind.__name__}?)")
        out.extend([value] * count)
    return tuple(out)


def _register_wire() -> None:
    # BatchMeta travels between processes as its plain dict (a codec extension).
    from rayless.transport import register_extension

    register_extension(
        BatchMeta, "rayless.store.batch_meta", BatchMeta.to_dict, BatchMeta.from_dict
    )


_register_wire()

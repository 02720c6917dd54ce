"""How a state dict lies in weight-sync buckets, and the copies in and out of them.

A layout is a list of ``(name, dtype, shape, bucket, offset, nbytes)`` rows (:data:`Row`, typed
on the wire and checked by :func:`rows_of` where it arrives untyped): each tensor sits
whole in one bucket (a bucket holds ``bucket_bytes`` or one bigger tensor), 64-byte aligned.
On the CPU path the buckets lie back to back in one shared-memory segment; on the CUDA path
each bucket is one flat CUDA allocation shared by IPC. The copies convert dtypes on the way
and check names and shapes first, naming the tensor that does not match.

Aliases (tied weights: two names, one tensor, e.g. ``model.embed_tokens.weight`` and
``lm_head.weight``) get one place: the alias's row points at its original's bytes, so the
bytes travel once and :func:`feed_into` hands the tensor to a loader once, under the first
name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, Union

import torch

from rayless.transport.errors import ProtocolError
from rayless.weights.errors import WeightMismatchError
from rayless.weights.messages import Layout, Row

__all__ = [
    "Layout",
    "Loader",
    "Rename",
    "Row",
    "bucket_sizes",
    "by_bytes",
    "dtype_of",
    "feed_into",
    "make_layout",
    "read_into",
    "renamer",
    "row_bytes",
    "row_view",
    "rows_of",
    "targets_of",
    "write_from",
]

ALIGN = 64
T = TypeVar("T")
# An engine's loader: called once per bucket with that bucket's (name, tensor) pairs.
Loader = Callable[[Iterator[tuple[str, torch.Tensor]]], Any]
# Published name -> loader name: a mapping (names not in it stay), or a callable (None drops).
Rename = Union[Mapping[str, str], Callable[[str], Union[str, None]]]


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype a layout row names. Raises WeightMismatchError for an unknown one."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise WeightMismatchError(name, f"unknown dtype {name!r}")
    return dtype


def tensors_of(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of a state dict (other entries, e.g. extra state, are skipped)."""
    return {k: v.detach() for k, v in state.items() if isinstance(v, torch.Tensor)}


def _identity(t: torch.Tensor) -> tuple[Any, ...] | None:
    """What makes two tensors one (an alias): same memory, dtype, shape and strides."""
    if not t.numel():
        return None
    return (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride())


def make_layout(tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> Layout:
    """Place every tensor in a bucket of ``bucket_bytes`` (one bigger tensor gets its own);
    an alias of an earlier tensor (tied weights) gets its original's place."""
    rows: Layout = []
    bucket, used = 0, 0
    placed: dict[tuple[Any, ...], Row] = {}
    for name, t in tensors.items():
        key = _identity(t)
        first = placed.get(key) if key is not None else None
        if first is not None:
            rows.append((name, *first[1:]))
            continue
        n = t.numel() * t.element_size()
        if used and used + n > bucket_bytes:
            bucket, used = bucket + 1, 0
        rows.append((name, str(t.dtype), tuple(t.shape), bucket, used, n))
        if key is not None:
            placed[key] = rows[-1]
        used += -(-n // ALIGN) * ALIGN
    return rows


def rows_of(raw: Any) -> Layout:
    """``raw`` (a layout decoded without types, e.g. from msgpack) as checked :data:`Row` s.

    Raises ProtocolError when a row is not ``(str, str, [int...], int, int, int)``.
    """
    if not isinstance(raw, (list, tuple)):
        raise ProtocolError(f"a weight layout is a list of rows, not {type(raw).__name__}")
    rows: Layout = []
    for row in raw:
        if not (isinstance(row, (list, tuple)) and len(row) == 6):
            raise ProtocolError(f"malformed weight layout row {row!r:.80}")
        name, dtype, shape, bucket, offset, n = row
        ints = [bucket, offset, n, *shape] if isinstance(shape, (list, tuple)) else None
        if (
            type(name) is not str
            or type(dtype) is not str
            or ints is None
            or any(type(i) is not int or i < 0 for i in ints)
        ):
            raise ProtocolError(f"malformed weight layout row {row!r:.80}")
        rows.append((name, dtype, tuple(shape), bucket, offset, n))
    return rows


def _firsts(layout: Layout) -> list[Row]:
    """The rows that own their bytes (an alias shares its original's bucket and offset)."""
    seen: set[tuple[int, int]] = set()
    out = []
    for row in layout:
        if row[5]:  # an empty tensor owns no bytes (the next tensor starts at its offset)
            place = (row[3], row[4])
            if place in seen:
                continue
            seen.add(place)
        out.append(row)
    return out


def bucket_sizes(layout: Layout) -> list[int]:
    """Bytes of each bucket of ``layout``."""
    sizes: list[int] = []
    for _, _, _, bucket, offset, n in layout:
        while len(sizes) <= bucket:
            sizes.append(0)
        sizes[bucket] = max(sizes[bucket], -(-(offset + n) // ALIGN) * ALIGN)
    return sizes


def row_view(buffer: torch.Tensor, row: Row, base: int) -> torch.Tensor:
    """The tensor of ``row`` in ``buffer`` (flat uint8; its bucket at ``base``), a view."""
    _, dtype, shape, _, offset, n = row
    flat = buffer[base + offset : base + offset + n]
    return (
        flat.view(dtype_of(dtype)).view(shape) if n else torch.empty(shape, dtype=dtype_of(dtype))
    )


def row_bytes(payload: memoryview, row: Row, base: int) -> memoryview:
    """The bytes of ``row`` in ``payload`` (its bucket at ``base``)."""
    return payload[base + row[4] : base + row[4] + row[5]]


BATCH = 1 << 20  # tensors below this many bytes are copied in one foreach call per batch


def _flat(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s bytes as a flat uint8 view, or None (not contiguous)."""
    return t.reshape(-1).view(torch.uint8) if t.is_contiguous() else None


def _places(
    layout: Layout, buckets: Sequence[torch.Tensor], starts: Sequence[int] | None
) -> dict[tuple[int, int], torch.Tensor]:
    """A flat uint8 view of every place (bucket, offset) of ``layout``'s non-empty rows, each
    bucket's made by one ``split_with_sizes`` (many small tensors cost one call, not one each).
    """
    by_bucket: dict[int, set[tuple[int, int]]] = {}
    for row in layout:
        if row[5]:
            by_bucket.setdefault(row[3], set()).add((row[4], row[5]))
    out: dict[tuple[int, int], torch.Tensor] = {}
    for b, places in by_bucket.items():
        base = starts[b] if starts else 0
        ordered = sorted(places)
        sizes: list[int] = []
        keep: list[tuple[int, int] | None] = []
        first = pos = ordered[0][0]
        for offset, n in ordered:
            if offset < pos:  # overlapping places (never made by make_layout): one by one
                for o, m in ordered:
                    out[b, o] = buckets[b][base + o : base + o + m]
                break
            if offset > pos:
                sizes.append(offset - pos)
                keep.append(None)
            sizes.append(n)
            keep.append((b, offset))
            pos = offset + n
        else:
            parts = buckets[b][base + first : base + pos].split_with_sizes(sizes)
            out.update((k, p) for k, p in zip(keep, parts, strict=True) if k is not None)
    return out


PARALLEL = 32 << 20  # CPU copies of at least this many bytes in all run on threads
PIECE = 8 << 20  # in pieces of this size
_pool: ThreadPoolExecutor | None = None


def executor() -> ThreadPoolExecutor:
    """The threads of weight sync's CPU copies and checksums (torch and zlib release the
    GIL), one per core up to 16."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(min(16, os.cpu_count() or 1), thread_name_prefix="weights")
    return _pool


def _forget_pool() -> None:
    global _pool
    _pool = None  # a forked child has none of its parent's threads: it makes its own


os.register_at_fork(after_in_child=_forget_pool)


def by_bytes(items: Sequence[T], nbytes: Callable[[T], int], limit: int = PIECE) -> list[list[T]]:
    """``items`` in order, in groups of at most ``limit`` bytes each (an item bigger than that
    alone): the tasks of work spread over :func:`executor`'s threads."""
    groups: list[list[T]] = [[]]
    size = 0
    for item in items:
        n = nbytes(item)
        if size and size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += n
    return groups


def _copy(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    pair[0].copy_(pair[1])


def _copy_pairs(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """``dst.copy_(src)`` for every pair of flat uint8 views: small same-device ones in
    foreach calls, big CPU ones in pieces; on threads where they add up to :data:`PARALLEL`."""
    small, big = [], []
    for dst, src in pairs:
        if dst.device == src.device and dst.numel() < BATCH:
            small.append((dst, src))
        elif dst.device.type == src.device.type == "cpu":
            big.append((dst, src))
        else:
            dst.copy_(src)
    if sum(d.numel() for d, _ in big) >= PARALLEL and (os.cpu_count() or 1) > 1:
        pieces = [(d[o : o + PIECE], s[o : o + PIECE]) for d, s in big
                  for o in range(0, d.numel(), PIECE)]  # fmt: skip
        list(executor().map(_copy, pieces))
    else:
        for pair in big:
            _copy(pair)
    if not small:
        return
    if sum(d.numel() for d, _ in small) >= PARALLEL and (os.cpu_count() or 1) > 1:
        # about PIECE bytes per foreach call, the calls on threads
        list(executor().map(_foreach_copy, by_bytes(small, lambda pair: pair[0].numel())))
    else:
        _foreach_copy(small)


def _foreach_copy(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])


def write_from(
    tensors: Mapping[str, torch.Tensor],
    layout: Layout,
    buckets: Sequence[torch.Tensor],
    starts: Sequence[int] | None = None,
) -> None:
    """Copy every tensor into its place: ``buckets[b]`` (flat uint8), at ``starts[b]`` in it
    (an alias's bytes once)."""
    rows = [row for row in _firsts(layout) if row[5]]
    if not rows:
        return
    places = _places(rows, buckets, starts)
    pairs = []
    for row in rows:
        dst, src = places[row[3], row[4]], tensors[row[0]]
        flat = _flat(src) if src.dtype == dtype_of(row[1]) else None
        if flat is None:
            dst.view(dtype_of(row[1])).view(row[2]).copy_(src)
        else:
            pairs.append((dst, flat))
    _copy_pairs(pairs)


def targets_of(target: Any) -> dict[str, torch.Tensor]:
    """The tensors to fill: a module's parameters and buffers, or a dict of tensors.

    Raises TypeError for anything else.
    """
    if isinstance(target, torch.nn.Module):
        return tensors_of(target.state_dict(keep_vars=True))
    if isinstance(target, Mapping):
        return {k: v for k, v in target.items() if isinstance(v, torch.Tensor)}
    raise TypeError(f"pull fills a torch.nn.Module or a dict of tensors, not {type(target)}")


def check(layout: Layout, targets: Mapping[str, torch.Tensor], strict: bool) -> None:
    """Raise WeightMismatchError naming the first tensor whose name or shape differs."""
    names = {row[0] for row in layout}
    if strict:
        for name in targets:
            if name not in names:
                raise WeightMismatchError(name, "is not in the published weights")
    for name, _, shape, *_ in layout:
        t = targets.get(name)
        if t is None:
            if strict:
                raise WeightMismatchError(name, "is published but the target has no such tensor")
            continue
        if list(t.shape) != list(shape):
            raise WeightMismatchError(
                name, f"has shape {list(t.shape)} here but {list(shape)} in the published weights"
            )


def read_into(
    layout: Layout,
    buckets: Sequence[torch.Tensor],
    targets: Mapping[str, torch.Tensor],
    starts: Sequence[int] | None = None,
) -> None:
    """Copy each published tensor into its target in place (dtype and device converted)."""
    rows = [row for row in layout if row[5] and row[0] in targets]
    if not rows:
        return
    places = _places(rows, buckets, starts)
    pairs = []
    with torch.no_grad():
        for row in rows:
            dst, src = targets[row[0]], places[row[3], row[4]]
            flat = _flat(dst) if dst.dtype == dtype_of(row[1]) else None
            if flat is None or flat.data_ptr() != dst.data_ptr():
                dst.copy_(src.view(dtype_of(row[1])).view(row[2]))
            else:
                pairs.append((flat, src))
        _copy_pairs(pairs)


def renamer(rename: Rename | None) -> Callable[[str], str | None]:
    """``rename`` as a function (None: names unchanged). Raises TypeError for anything else."""
    if rename is None:
        return lambda name: name
    if isinstance(rename, Mapping):
        table = dict(rename)
        return lambda name: table.get(name, name)
    if callable(rename):
        return rename
    raise TypeError(f"rename is a mapping or a callable, not {type(rename)}")


def feed_into(
    layout: Layout,
    buckets: Sequence[torch.Tensor],
    loader: Loader,
    rename: Callable[[str], str | None],
    dtype: torch.dtype | None,
    starts: Sequence[int] | None = None,
) -> int:
    """Call ``loader`` once per bucket with a lazy iterator of that bucket's ``(name, tensor)``
    pairs: each tensor a private copy (the loader may keep it), floating tensors converted to
    ``dtype`` (None: as published), names through ``rename`` (None drops the tensor), an
    alias (tied weights) once under its first name. Returns the loader's calls."""
    by_bucket: dict[int, list[Row]] = {}
    for row in _firsts(layout):
        by_bucket.setdefault(int(row[3]), []).append(row)

    def items(bucket: int, rows: list[Row]) -> Iterator[tuple[str, torch.Tensor]]:
        base = starts[bucket] if starts else 0
        for row in rows:
            name = rename(row[0])
            if name is None:
                continue
            view = row_view(buckets[bucket], row, base)
            to = dtype if dtype is not None and view.is_floating_point() else view.dtype
            yield name, view.to(to, copy=True)

    for bucket in sorted(by_bucket):
        loader(items(bucket, by_bucket[bucket]))
    return len(by_bucket)

"""Resharding: a trainer publishes in its layout, an engine rank pulls its slice of each tensor.

A publisher marks each row that is a slice of a tensor with a :class:`ShardSpec` (a
:class:`~rayless.weights.messages.Piece` of its entry): the full tensor is the slices of every
rank of ``world`` along ``dim``, from every shard of the version. A pull with ``shard=`` names
the slice it wants of each tensor (a spec for all, a mapping, or a function of the name; None:
the whole tensor). Every slice is a box in the full tensor's coordinates; the pull copies the
intersection of each published box with the wanted one, so a rank reads only the bytes it needs
(one strided copy per piece), whatever the two layouts (TP 2 → TP 4, FSDP 4 → TP 2, full → TP).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Union

import torch

from rayless.weights.errors import WeightInputError, WeightMismatchError
from rayless.weights.layout import Loader, Row, dtype_of, row_view
from rayless.weights.messages import Entry, PathKind, ShardSpec
from rayless.weights.sinks import LoaderSink, Sink, Targets

__all__ = ["Box", "ReshardSink", "Spec", "box_of", "resharding", "spec_of"]

# What a publish or pull says of its slices: one spec for every tensor, a mapping (names not
# in it whole), or a function of the name (None: whole).
Spec = Union[
    ShardSpec, Mapping[str, Union[ShardSpec, None]], Callable[[str], Union[ShardSpec, None]]
]
Box = list[tuple[int, int]]  # per dimension: [start, end) in the full tensor


def _checked(spec: ShardSpec | None) -> ShardSpec | None:
    if spec is None:
        return None
    if not isinstance(spec, ShardSpec):
        raise TypeError(f"a shard is a ShardSpec or None, not {type(spec).__name__}")
    if not (spec.dim >= 0 and spec.world >= 1 and 0 <= spec.rank < spec.world):
        raise WeightInputError(f"bad {spec}")
    return spec


def spec_of(spec: Spec | None) -> Callable[[str], ShardSpec | None]:
    """``spec`` as a function of a tensor's name. Raises TypeError for anything else."""
    if spec is None:
        return lambda name: None
    if isinstance(spec, ShardSpec):
        one = _checked(spec)
        return lambda name: one
    if isinstance(spec, Mapping):
        table = {k: _checked(v) for k, v in spec.items()}
        return lambda name: table.get(name)
    if callable(spec):
        return lambda name: _checked(spec(name))
    raise TypeError(f"shard is a ShardSpec, a mapping or a callable, not {type(spec)}")


def box_of(name: str, full: Sequence[int], spec: ShardSpec | None) -> Box:
    """The box of ``spec``'s slice in a tensor of shape ``full``. Raises WeightMismatchError
    when the tensor has no such dimension or does not split evenly."""
    box = [(0, n) for n in full]
    if spec is not None:
        if spec.dim >= len(full) or full[spec.dim] % spec.world:
            raise WeightMismatchError(
                name, f"of shape {list(full)} does not split in {spec.world} along {spec.dim}"
            )
        step = full[spec.dim] // spec.world
        box[spec.dim] = (spec.rank * step, (spec.rank + 1) * step)
    return box


def _full(name: str, shape: Sequence[int], spec: ShardSpec | None) -> list[int]:
    full = list(shape)
    if spec is not None:
        if spec.dim >= len(full):
            raise WeightMismatchError(name, f"is {len(full)}-d: no slice along {spec.dim}")
        full[spec.dim] *= spec.world
    return full


def _copy_box(src: torch.Tensor, src_box: Box, dst: torch.Tensor, dst_box: Box) -> int:
    """Copy the intersection of two boxes; the elements copied."""
    inter = [(max(a[0], b[0]), min(a[1], b[1])) for a, b in zip(src_box, dst_box, strict=True)]
    if any(lo >= hi for lo, hi in inter):
        return 0
    for d, (lo, hi) in enumerate(inter):
        src = src.narrow(d, lo - src_box[d][0], hi - lo)
        dst = dst.narrow(d, lo - dst_box[d][0], hi - lo)
    dst.copy_(src)
    return dst.numel()


class ReshardSink(Sink):
    """A pull's slices (``want``) of the published tensors, in place into ``targets``, or,
    with ``loader``, into fresh tensors handed to it once every shard is copied (in groups of
    about ``bucket_bytes``, names through ``rename``, floating ones as ``dtype``)."""

    def __init__(
        self,
        targets: dict[str, torch.Tensor] | None,
        want: Callable[[str], ShardSpec | None],
        strict: bool,
        loader: Loader | None = None,
        rename: Callable[[str], str | None] | None = None,
        dtype: torch.dtype | None = None,
        bucket_bytes: int = 512 << 20,
    ) -> None:
        self.targets = targets if targets is not None else {}
        self.want = want
        self.strict = strict
        self.loader = loader
        self.rename = rename or (lambda name: name)
        self.dtype = dtype
        self.bucket_bytes = bucket_bytes
        self.boxes: dict[str, Box] = {}  # name -> the wanted box in the full tensor
        # a loader's tensors are fresh: a slice of a tensor changed in one shard only would
        # reach it half filled
        self.takes_deltas = loader is None

    def check_parts(self, parts: Sequence[Entry]) -> None:
        """Full shapes agree across shards, every slice of each is published, and each target
        has its wanted slice's shape. Raises WeightMismatchError naming the tensor."""
        full: dict[str, list[int]] = {}
        dtypes: dict[str, torch.dtype] = {}
        ranks: dict[str, set[tuple[int, int, int]]] = {}
        for part in parts:
            specs = {p.row: p.spec for p in part.pieces}
            for i, row in enumerate(part.layout):
                spec = specs.get(i)
                name = row[0]
                shape = _full(name, row[2], spec)
                if full.setdefault(name, shape) != shape:
                    raise WeightMismatchError(name, "has different full shapes in two shards")
                dtypes[name] = dtype_of(row[1])
                if spec is not None:
                    ranks.setdefault(name, set()).add((spec.dim, spec.world, spec.rank))
        for name, got in ranks.items():
            dims = {(d, w) for d, w, _ in got}
            if len(dims) != 1 or {r for *_, r in got} != set(range(next(iter(dims))[1])):
                raise WeightMismatchError(name, "is not published whole (a shard is missing)")
        if self.strict and self.loader is None:
            for name in self.targets:
                if name not in full:
                    raise WeightMismatchError(name, "is not in the published weights")
        self.boxes = {}
        for name, shape in full.items():
            box = box_of(name, shape, self.want(name))
            want = [hi - lo for lo, hi in box]
            if self.loader is not None:
                if self.rename(name) is None:
                    continue
                floating = dtypes[name].is_floating_point
                to = self.dtype if self.dtype is not None and floating else dtypes[name]
                self.targets[name] = torch.empty(want, dtype=to)
            t = self.targets.get(name)
            if t is None:
                if self.strict:
                    raise WeightMismatchError(
                        name, "is published but the target has no such tensor"
                    )
                continue
            if list(t.shape) != want:
                raise WeightMismatchError(
                    name, f"has shape {list(t.shape)} here but its slice is {want}"
                )
            self.boxes[name] = box

    def copy(
        self, layout: list[Row], buckets: list[torch.Tensor], starts: list[int] | None
    ) -> None:
        self.copy_part(Entry(PathKind.SHM, -1, layout), buckets, starts)

    def copy_part(
        self, entry: Entry, buckets: list[torch.Tensor], starts: list[int] | None
    ) -> None:
        specs = {p.row: p.spec for p in entry.pieces}
        with torch.no_grad():
            for i, row in enumerate(entry.layout):
                box = self.boxes.get(row[0])
                if box is None or not row[5]:
                    continue
                spec = specs.get(i)
                src = row_view(buckets[row[3]], row, starts[row[3]] if starts else 0)
                src_box = box_of(row[0], _full(row[0], row[2], spec), spec)
                _copy_box(src, src_box, self.targets[row[0]], box)

    def finish(self) -> None:
        if self.loader is None:
            return
        names = list(self.boxes)
        start = 0
        while start < len(names):
            end, size = start, 0
            while end < len(names) and (end == start or size < self.bucket_bytes):
                t = self.targets[names[end]]
                size += t.numel() * t.element_size()
                end += 1
            self.loader(self._items(names[start:end]))
            start = end
        self.targets = {}

    def _items(self, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        for name in names:
            new = self.rename(name)
            if new is not None:
                yield new, self.targets[name]


def resharding(sink: Targets | LoaderSink, shard: Spec, bucket_bytes: int) -> ReshardSink:
    """``sink`` (from ``sink_for``) taking only the slices ``shard`` names. Raises TypeError
    for a bad ``shard``."""
    want = spec_of(shard)
    if isinstance(sink, Targets):
        return ReshardSink(sink.targets, want, sink.strict)
    return ReshardSink(None, want, True, sink.loader, sink.rename, sink.dtype, bucket_bytes)

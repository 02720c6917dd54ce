"""Where a pull's bytes go: a module's or a dict's tensors, or an engine's loader.

Every transfer path (``rayless.weights.paths``) hands the buckets it reads to a :class:`Sink`:
``check`` the layout first (before anything is copied), then ``copy`` each shard's buckets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rayless.weights.errors import WeightInputError
from rayless.weights.layout import (
    Layout,
    Loader,
    Rename,
    check,
    feed_into,
    read_into,
    renamer,
    targets_of,
)
from rayless.weights.messages import Entry

__all__ = ["LoaderSink", "Sink", "Targets", "sink_for"]


class Sink:
    """Where a pull's bytes go: ``check_parts`` first, then ``copy_part`` each part (shard) of
    the version into it, then ``finish``. ``takes_deltas``: whether a pull may copy only the
    tensors changed since the version the sink last got (else every tensor, always)."""

    takes_deltas = True

    def check(self, layout: Layout) -> None:
        """Raise WeightMismatchError before anything is copied (default: nothing to check)."""

    def check_parts(self, parts: Sequence[Entry]) -> None:
        """Check every part of a version before anything is copied (default: ``check`` of
        their rows together). Raises WeightMismatchError naming the tensor."""
        self.check([row for part in parts for row in part.layout])

    def copy_part(
        self, entry: Entry, buckets: list[torch.Tensor], starts: list[int] | None
    ) -> None:
        """Copy ``entry``'s tensors out of ``buckets`` (default: ``copy`` of its layout)."""
        self.copy(entry.layout, buckets, starts)

    def finish(self) -> None:
        """Every part is copied (a sink that gathers hands its tensors on here)."""

    def copy(self, layout: Layout, buckets: list[torch.Tensor], starts: list[int] | None) -> None:
        """Copy the tensors of ``layout`` out of ``buckets`` (flat uint8; bucket ``b`` at
        ``starts[b]`` in its buffer, or at 0)."""
        raise NotImplementedError


class Targets(Sink):
    """A module's or a dict's tensors, filled in place."""

    def __init__(self, targets: dict[str, torch.Tensor], strict: bool) -> None:
        self.targets = targets
        self.strict = strict

    def check(self, layout: Layout) -> None:
        check(layout, self.targets, self.strict)

    def copy(self, layout: Layout, buckets: list[torch.Tensor], starts: list[int] | None) -> None:
        read_into(layout, buckets, self.targets, starts)


class LoaderSink(Sink):
    """An engine's loader, called once per bucket (``feed_into``)."""

    def __init__(
        self, loader: Loader, rename: Callable[[str], str | None], dtype: torch.dtype | None
    ) -> None:
        self.loader = loader
        self.rename = rename
        self.dtype = dtype

    def copy(self, layout: Layout, buckets: list[torch.Tensor], starts: list[int] | None) -> None:
        feed_into(layout, buckets, self.loader, self.rename, self.dtype, starts)


def sink_for(
    target: Any,
    strict: bool,
    into: Loader | None,
    rename: Rename | None,
    dtype: torch.dtype | None,
) -> Targets | LoaderSink:
    """The sink of a pull's arguments (``WeightSync.pull``).

    Raises WeightInputError (both or neither of ``target`` and ``into``; ``rename``/``dtype``
    without ``into``), TypeError (not a module or dict, a bad ``rename``, ``into`` or ``dtype``).
    """
    if (target is None) == (into is None):
        raise WeightInputError("pull takes a target (module or dict) or into=, one of them")
    if into is None:
        if rename is not None or dtype is not None:
            raise WeightInputError("rename= and dtype= apply to pull(into=...) only")
        return Targets(targets_of(target), strict)
    if not callable(into):
        raise TypeError(f"into is a callable (an engine's loader), not {type(into)}")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype is a torch.dtype, not {type(dtype)}")
    return LoaderSink(into, renamer(rename), dtype)

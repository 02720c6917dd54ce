"""Samplers: which ready, unconsumed samples a ``get_meta`` request receives.

A sampler picks ``batch_size`` global indexes out of the candidates (ready and not yet consumed
by the requesting task, in allocation order), or returns ``None`` when it cannot pick a full
batch yet (the caller then waits for more data). Samplers are pure apart from their own random
state; they travel as specs (``"sequential"``, ``{"name": "random", "seed": 1}``,
``{"name": "grouped", "n": 8}``) built with :func:`make_sampler`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from rayless.store.errors import StoreInputError

__all__ = [
    "GroupedSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "make_sampler",
]

GroupOf = Callable[[int], Hashable]


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise StoreInputError(f"batch_size must be a positive int, got {batch_size!r}")


@runtime_checkable
class Sampler(Protocol):
    """Picks a batch from candidate indexes; ``None`` means not enough candidates yet."""

    def select(
        self, candidates: Sequence[int], batch_size: int, group_of: GroupOf
    ) -> list[int] | None:
        """``batch_size`` distinct indexes from ``candidates``, or None. Raises StoreInputError."""
        ...

    def spec(self) -> dict[str, Any]:
        """Plain values that rebuild an equivalent sampler through :func:`make_sampler`."""
        ...


class SequentialSampler:
    """The oldest candidates first (allocation order)."""

    def select(
        self, candidates: Sequence[int], batch_size: int, group_of: GroupOf
    ) -> list[int] | None:
        """The first ``batch_size`` candidates, or None if there are fewer."""
        _check_batch_size(batch_size)
        if len(candidates) < batch_size:
            return None
        return list(candidates[:batch_size])

    def spec(self) -> dict[str, Any]:
        """``{"name": "sequential"}``."""
        return {"name": "sequential"}


class RandomSampler:
    """A uniformly random subset of the candidates, reproducible for a given ``seed``."""

    def __init__(self, seed: int | None = None) -> None:
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise StoreInputError(f"seed must be an int or None, got {seed!r}")
        self.seed = seed
        self._rng = random.Random(seed)

    def select(
        self, candidates: Sequence[int], batch_size: int, group_of: GroupOf
    ) -> list[int] | None:
        """``batch_size`` random candidates, or None if there are fewer (no random draw then)."""
        _check_batch_size(batch_size)
        if len(candidates) < batch_size:
            return None
        return self._rng.sample(list(candidates), batch_size)

    def spec(self) -> dict[str, Any]:
        """``{"name": "random", "seed": seed}``."""
        return {"name": "random", "seed": self.seed}


class GroupedSampler:
    """Whole groups of ``n`` samples (GRPO: the ``n`` responses of one prompt) and nothing less.

    A group is the set of samples with the same group key (see the controller's ``group_ids``);
    it is complete when all ``n`` of its samples are candidates. ``batch_size`` must be a
    multiple of ``n``; the batch is ``batch_size // n`` complete groups, oldest first (or random
    ones with ``shuffle``), each group's samples in allocation order. A group is never split.
    """

    def __init__(self, n: int, shuffle: bool = False, seed: int | None = None) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise StoreInputError(f"group size n must be a positive int, got {n!r}")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise StoreInputError(f"seed must be an int or None, got {seed!r}")
        self.n = n
        self.shuffle = bool(shuffle)
        self.seed = seed
        self._rng = random.Random(seed)

    def select(
        self, candidates: Sequence[int], batch_size: int, group_of: GroupOf
    ) -> list[int] | None:
        """Complete groups making ``batch_size`` samples, or None if too few are complete.

        Raises StoreInputError if ``batch_size`` is not a multiple of ``n`` or a group holds
        more than ``n`` candidates.
        """
        _check_batch_size(batch_size)
        if batch_size % self.n:
            raise StoreInputError(
                f"batch_size {batch_size} is not a multiple of the group size {self.n}"
            )
        groups: dict[Hashable, list[int]] = {}
        for index in candidates:
            groups.setdefault(group_of(index), []).append(index)
        complete = []
        for key, members in groups.items():
            if len(members) > self.n:
                raise StoreInputError(
                    f"group {key!r} holds {len(members)} samples, more than the group size {self.n}"
                )
            if len(members) == self.n:
                complete.append(members)
        wanted = batch_size // self.n
        if len(complete) < wanted:
            return None
        chosen = self._rng.sample(complete, wanted) if self.shuffle else complete[:wanted]
        return [index for members in chosen for index in members]

    def spec(self) -> dict[str, Any]:
        """``{"name": "grouped", "n": n, "shuffle": shuffle, "seed": seed}``."""
        return {"name": "grouped", "n": self.n, "shuffle": self.shuffle, "seed": self.seed}


def make_sampler(spec: str | Mapping[str, Any] | Sampler | None = None) -> Sampler:
    """A sampler from a spec: None/``"sequential"``, ``"random"``, ``"grouped"`` (needs ``n``),
    a dict ``{"name": ..., **kwargs}``, or a Sampler (returned as is). Raises StoreInputError.
    """
    if spec is None:
        return SequentialSampler()
    if isinstance(spec, Sampler) and not isinstance(spec, (str, Mapping)):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        raise StoreInputError(f"not a sampler spec: {spec!r}")
    kwargs = dict(spec)
    name = kwargs.pop("name", None)
    try:
        if name == "sequential" and not kwargs:
            return SequentialSampler()
        if name == "random":
            return RandomSampler(**kwargs)
        if name == "grouped":
            return GroupedSampler(**kwargs)
    except TypeError as exc:
        raise StoreInputError(f"bad arguments for sampler {name!r}: {exc}")
    raise StoreInputError(f"unknown sampler spec {dict(spec)!r}")

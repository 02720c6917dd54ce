"""Samplers: which ready, unconsumed samples a ``get_meta`` request receives.

A sampler picks ``batch_size`` global indexes out of the candidates (ready and not yet consumed
by the requesting task, in allocation order), or returns ``None`` when it cannot pick a full
batch yet (the caller then waits for more data). Samplers are pure apart from their own random
state; they travel as specs (``"sequential"``, ``{"name": "random", "seed": 1}``,
``{"name": "grouped", "n": 8}``) built with :func:`make_sampler`.

Samplers are found by name in a registry (:func:`register_sampler`): a spec
``{"name": name, **kwargs}`` builds ``cls(**kwargs)``. A sampler of the user's own travels by
class reference: its spec's name is ``"package.module:Class"`` (:func:`sampler_ref`), which
the controller imports. What the controller may rely on, a sampler declares as its
``capabilities`` (:class:`Capabilities`: whole groups of some size, oldest first); one that
declares none gets every candidate and no groups. Adding a sampler is one class::

    @register_sampler("longest")
    class LongestSampler:
        capabilities = Capabilities()

        def select(self, candidates, batch_size, group_of): ...
        def spec(self): return {"name": "longest"}
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from rayless.store.errors import StoreInputError

__all__ = [
    "Capabilities",
    "GroupedSampler",
    "RandomSampler",
    "Sampler",
    "SeqlenBalancedSampler",
    "SequentialSampler",
    "balanced_split",
    "capabilities_of",
    "make_sampler",
    "register_sampler",
    "sampler_names",
    "sampler_ref",
]

GroupOf = Callable[[int], Hashable]
C = TypeVar("C", bound=type)
_REGISTRY: dict[str, type] = {}


@dataclass(frozen=True)
class Capabilities:
    """What a sampler promises the controller: ``group_size``: it picks whole groups of this
    many samples (the partition's group size is checked and fixed by it; None: no groups);
    ``sequential``: it takes the oldest candidates first (the controller then hands it no
    candidate list and takes them itself, in O(batch))."""

    group_size: int | None = None
    sequential: bool = False


NO_CAPABILITIES = Capabilities()


def capabilities_of(sampler: object) -> Capabilities:
    """What ``sampler`` declares (its ``capabilities``); nothing for one that declares none."""
    caps = getattr(sampler, "capabilities", None)
    return caps if isinstance(caps, Capabilities) else NO_CAPABILITIES


def register_sampler(name: str) -> Callable[[C], C]:
    """Make the spec ``{"name": name, **kwargs}`` build ``cls(**kwargs)`` (a class decorator).

    Raises:
        ValueError: ``name`` is empty, holds ``":"`` (class references), or is taken by
            another class.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"a sampler name must be a non-empty str without ':', got {name!r}")

    def register(cls: C) -> C:
        taken = _REGISTRY.get(name)
        if taken is not None and taken is not cls:
            raise ValueError(f"sampler name {name!r} is taken by {taken.__qualname__}")
        _REGISTRY[name] = cls
        return cls

    return register


def sampler_names() -> list[str]:
    """The registered samplers' names."""
    return sorted(_REGISTRY)


def sampler_ref(cls: type) -> str:
    """The class reference of a sampler class (``"package.module:Class"``): a spec with it as
    its name builds the class wherever it is importable."""
    return f"{cls.__module__}:{cls.__qualname__}"


def _by_ref(ref: str) -> type:
    """The sampler class ``ref`` (:func:`sampler_ref`) names. Raises StoreInputError."""
    module, _, qualname = ref.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise StoreInputError(f"cannot import sampler {ref!r}: {exc}") from None
    if not isinstance(found, type) or not all(
        callable(getattr(found, m, None)) for m in ("select", "spec")
    ):
        raise StoreInputError(f"{ref!r} is not a sampler class (select and spec)")
    return found


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


@register_sampler("sequential")
class SequentialSampler:
    """The oldest candidates first (allocation order)."""

    capabilities = Capabilities(sequential=True)

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


@register_sampler("random")
class RandomSampler:
    """A uniformly random subset of the candidates, reproducible for a given ``seed``."""

    capabilities = NO_CAPABILITIES

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


@register_sampler("grouped")
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
        self.capabilities = Capabilities(group_size=n)

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


def balanced_split(lengths: Sequence[int], parts: int, group: int = 1) -> list[list[int]]:
    """Positions ``0..len(lengths)-1`` in ``parts`` lists of equal size with totals of
    ``lengths`` as even as possible (largest first onto the lightest part that has room).

    Consecutive runs of ``group`` positions stay together (GRPO groups). Deterministic: every
    rank computing it gets the same answer. Raises StoreInputError unless the groups split
    into ``parts`` equal shares.
    """
    if not isinstance(parts, int) or isinstance(parts, bool) or parts <= 0:
        raise StoreInputError(f"parts must be a positive int, got {parts!r}")
    if group <= 0 or len(lengths) % group:
        raise StoreInputError(f"{len(lengths)} samples are not whole groups of {group}")
    n_groups = len(lengths) // group
    if n_groups % parts:
        raise StoreInputError(f"{n_groups} groups do not split into {parts} equal parts")
    per_part = n_groups // parts
    weights = [sum(int(x) for x in lengths[g * group : (g + 1) * group]) for g in range(n_groups)]
    order = sorted(range(n_groups), key=lambda g: (-weights[g], g))
    totals = [0] * parts
    chosen: list[list[int]] = [[] for _ in range(parts)]
    for g in order:
        room = [r for r in range(parts) if len(chosen[r]) < per_part]
        r = min(room, key=lambda r: (totals[r], r))
        chosen[r].append(g)
        totals[r] += weights[g]
    return [[g * group + k for g in sorted(gs) for k in range(group)] for gs in chosen]


@register_sampler("seqlen_balanced")
class SeqlenBalancedSampler:
    """A global batch for ``dp_size`` data-parallel ranks whose per-rank token totals are
    balanced (sequence-length balancing, as verl and TransferQueue do).

    ``select`` picks the batch like :class:`SequentialSampler` (``n`` 1) or
    :class:`GroupedSampler` (whole groups of ``n``); :meth:`split` then cuts it into
    ``dp_size`` equal parts with even totals of each sample's ``custom_meta[length_key]``
    (1 where missing), groups kept whole. The streaming loader uses it: each rank reads its
    part of the shared global batch.
    """

    def __init__(self, dp_size: int = 1, n: int = 1, length_key: str = "total_lengths") -> None:
        for name, v in (("dp_size", dp_size), ("n", n)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise StoreInputError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(length_key, str) or not length_key:
            raise StoreInputError(f"length_key must be a non-empty str, got {length_key!r}")
        self.dp_size = dp_size
        self.n = n if n > 1 else None
        self.length_key = length_key
        self._inner: Sampler = GroupedSampler(n) if n > 1 else SequentialSampler()
        self.capabilities = capabilities_of(self._inner)

    def select(
        self, candidates: Sequence[int], batch_size: int, group_of: GroupOf
    ) -> list[int] | None:
        """Like the sequential (or grouped) sampler; ``batch_size`` is the global batch."""
        return self._inner.select(candidates, batch_size, group_of)

    def split(self, custom: Sequence[Mapping[str, Any]]) -> list[list[int]]:
        """The positions of each rank's part of a batch whose per-sample custom metadata is
        ``custom``. Raises StoreInputError (not whole groups, not divisible by dp_size)."""
        lengths = [_length(c.get(self.length_key, 1)) for c in custom]
        return balanced_split(lengths, self.dp_size, self.n or 1)

    def spec(self) -> dict[str, Any]:
        """``{"name": "seqlen_balanced", "dp_size": ..., "n": ..., "length_key": ...}``."""
        return {
            "name": "seqlen_balanced",
            "dp_size": self.dp_size,
            "n": self.n or 1,
            "length_key": self.length_key,
        }


def _length(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise StoreInputError(f"a sample's length must be a number >= 0, got {value!r}")
    return int(value)


def make_sampler(spec: str | Mapping[str, Any] | Sampler | None = None) -> Sampler:
    """A sampler from a spec: None/``"sequential"``, a registered name (``"random"``,
    ``"grouped"`` needs ``n``...) or a class reference (``"package.module:Class"``), a dict
    ``{"name": ..., **kwargs}``, or a Sampler (returned as is). Raises StoreInputError.
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
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None and isinstance(name, str) and ":" in name:
        cls = _by_ref(name)
    if cls is None:
        raise StoreInputError(f"unknown sampler spec {dict(spec)!r}")
    try:
        sampler = cls(**kwargs)
    except TypeError as exc:
        raise StoreInputError(f"bad arguments for sampler {name!r}: {exc}") from None
    if not isinstance(sampler, Sampler):
        raise StoreInputError(f"sampler {name!r} built a {type(sampler).__name__}, no Sampler")
    return sampler

"""Ray's ``ray.util.as_completed`` and ``ray.util.map_unordered``: results as they finish.

Both are loops over ``ray.wait`` and ``ray.get``, with Ray's signatures and errors:
``as_completed(refs)`` yields the results of ``refs`` in batches of up to ``chunk_size`` as
``ray.wait`` finds them ready (the refs themselves with ``yield_obj_refs=True``);
``map_unordered(fn, items)`` submits ``fn.remote(item)`` for each item, and once
``backpressure_size`` calls are in flight yields a batch of finished ones before submitting
more. Further keyword arguments go to ``ray.wait`` (``timeout``, ``fetch_local``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

__all__ = ["as_completed", "map_unordered"]

DEFAULT_CHUNK_SIZE = 10
DEFAULT_BACKPRESSURE_SIZE = 100


def as_completed(
    refs: Sequence[Any],
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    yield_obj_refs: bool = False,
    **kwargs: Any,
) -> Iterator[Any]:
    """The results (or refs) of ``refs`` as batches of them finish; no order is promised.

    Raises:
        ValueError: ``chunk_size`` < 1, or ``num_returns`` given (``chunk_size`` is it).
        Any error of a task: ``ray.get``'s, when its batch is taken.
    """
    _check(chunk_size, kwargs)
    pending = list(refs)
    while pending:
        batch, pending = _batch(pending, chunk_size, yield_obj_refs, kwargs)
        yield from batch


def map_unordered(
    fn: Any,
    items: Iterable[Any],
    *,
    backpressure_size: int | None = DEFAULT_BACKPRESSURE_SIZE,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    yield_obj_refs: bool = False,
    **kwargs: Any,
) -> Iterator[Any]:
    """``fn.remote(item)`` for every item, at most ``backpressure_size`` in flight (None: no
    bound); the results (or refs) as they finish, in no promised order.

    Raises:
        ValueError: ``backpressure_size`` <= 0, ``chunk_size`` < 1, or ``num_returns``.
        Any error of a task: ``ray.get``'s, when its batch is taken.
    """
    if backpressure_size is not None and backpressure_size <= 0:
        raise ValueError("backpressure_size must be positive.")
    _check(chunk_size, kwargs)
    bound = float("inf") if backpressure_size is None else backpressure_size
    pending: list[Any] = []
    for item in items:
        pending.append(fn.remote(item))
        if len(pending) >= bound:
            batch, pending = _batch(pending, chunk_size, yield_obj_refs, kwargs)
            yield from batch
    yield from as_completed(pending, chunk_size=chunk_size, yield_obj_refs=yield_obj_refs, **kwargs)


def _check(chunk_size: int, kwargs: dict[str, Any]) -> None:
    if chunk_size < 1:
        raise ValueError("`chunk_size` must be >= 1")
    if "num_returns" in kwargs:
        raise ValueError("Use the `chunk_size` argument instead of `num_returns`.")


def _batch(
    refs: list[Any], chunk_size: int, yield_obj_refs: bool, kwargs: dict[str, Any]
) -> tuple[list[Any], list[Any]]:
    """One ``ray.wait`` of up to ``chunk_size`` refs: (their results or refs, the rest)."""
    from rayless import ray

    ready, rest = ray.wait(refs, num_returns=min(chunk_size, len(refs)), **kwargs)
    return (ready if yield_obj_refs else ray.get(ready)), rest

"""Driving an inference engine's own weight-update protocol from a pull.

Engines that serve while they train take new weights through a protocol, not a bare loader:
vLLM's native weight transfer (pause generation → start the update → update weights, bucket
by bucket → finish (post-processing, e.g. re-quantisation) → resume generation) and SGLang's
(pause generation → ``update_weights_from_tensor`` per bucket → continue generation).
:class:`UpdatableEngine` is that protocol, in vLLM's names; :func:`update_engine` waits for the
version first (generation is not paused while the trainer is still busy), then runs the
protocol around a ``pull(into=engine.update_weights)``. :class:`ModuleEngine` is the protocol
for a ``torch.nn.Module`` (the Hugging Face path: ``load_state_dict(strict=False)``).

The update starts just before the first bucket, once the pull's checks passed. The engine's
own errors reach the caller as themselves. When the pull fails before the first bucket (a
mismatch, a checksum, a timeout), the engine is resumed on its old weights, no update begun;
after it, its weights are torn, so it stays paused (and unfinished) and the error is raised:
update it again, then resume it. A delta that changed nothing pauses and resumes only.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["Feed", "ModuleEngine", "UpdatableEngine", "update_engine"]


@runtime_checkable
class UpdatableEngine(Protocol):
    """An engine's weight-update protocol (vLLM's names). Each method but
    ``update_weights`` may be a coroutine function; ``update_weights`` is called in the pull's
    copy thread, once per bucket, with that bucket's ``(name, tensor)`` pairs."""

    def pause_generation(self) -> Any: ...

    def start_weight_update(self) -> Any: ...

    def update_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> Any: ...

    def finish_weight_update(self) -> Any: ...

    def resume_generation(self) -> Any: ...


async def _call(method: Callable[[], Any]) -> Any:
    result = method()
    if inspect.isawaitable(result):
        result = await result
    return result


class Feed:
    """A pull's loader for ``engine``: starts its update before the first bucket (so a pull
    that fails its checks never starts one), hands each bucket to ``update_weights`` and notes
    that it did (``delivered``). One per engine, kept by its client: a pull into the same feed
    again is a pull into the same target (a delta copies only what changed)."""

    def __init__(self, engine: UpdatableEngine) -> None:
        self.engine = engine
        self.delivered = False
        self.loop: asyncio.AbstractEventLoop | None = None  # where its coroutines run

    def __call__(self, weights: Iterator[tuple[str, torch.Tensor]]) -> Any:
        if not self.delivered:
            self.delivered = True
            result = self.engine.start_weight_update()
            if inspect.isawaitable(result):  # from the pull's copy thread, on the loop
                assert self.loop is not None
                asyncio.run_coroutine_threadsafe(_awaited(result), self.loop).result()
        return self.engine.update_weights(weights)


async def _awaited(result: Awaitable[Any]) -> Any:
    return await result


async def update_engine(
    feed: Feed,
    pull: Callable[..., Awaitable[int]],
    wait: Callable[[], Awaitable[int]],
    **pull_options: Any,
) -> int:
    """Run the protocol of ``feed``'s engine around one pull: ``wait()`` for the version,
    pause, ``pull(into=feed, min_version=<it>, **pull_options)`` (which starts the update
    before its first bucket), finish (when it started), resume; the version.

    Raises TypeError when the engine lacks a method of the protocol; what the pull or the
    engine raises, as itself (see the module doc for the engine's state then).
    """
    engine = feed.engine
    if not isinstance(engine, UpdatableEngine):
        raise TypeError(f"{type(engine).__name__} lacks a method of the update protocol")
    version = await wait()
    await _call(engine.pause_generation)
    feed.delivered, feed.loop = False, asyncio.get_running_loop()
    try:
        version = await pull(into=feed, min_version=version, **pull_options)
        if feed.delivered:
            await _call(engine.finish_weight_update)
    except BaseException:
        if not feed.delivered:
            await _call(engine.resume_generation)
        raise
    await _call(engine.resume_generation)
    return version


class ModuleEngine:
    """The update protocol of a ``torch.nn.Module`` (e.g. a Hugging Face model): each bucket
    is loaded with ``load_state_dict(strict=False)``; pausing is the caller's business (a
    module does not generate on its own), so those steps only keep the order."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.updating = False

    def pause_generation(self) -> None:
        """Nothing to pause."""

    def start_weight_update(self) -> None:
        """Mark the update begun."""
        self.updating = True

    def update_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Load one bucket. Raises KeyError for a tensor the module has not."""
        unexpected = self.module.load_state_dict(dict(weights), strict=False).unexpected_keys
        if unexpected:
            raise KeyError(f"the module has no tensors {unexpected}")

    def finish_weight_update(self) -> None:
        """Mark the update done."""
        self.updating = False

    def resume_generation(self) -> None:
        """Nothing to resume."""

"""Blocking faces of async classes, over the portal (as anyio's ``portal.call``).

``class SyncStore(BlockingFace, face=Store)`` gives ``SyncStore`` every public member of
``Store``, generated from it (nothing copied by hand, so the two cannot drift):

- each async method becomes a blocking method of the same name, signature and docstring
  (``aclose`` becomes ``close``) that runs the coroutine on the face's ``SyncCluster`` portal,
  or on the process's home loop without one (``portal.run_sync``: the actor's loop inside an
  actor), and waits for it: at most the call's own ``timeout`` argument plus ``SLACK`` when
  the method has one (None: as long as it takes), else ``DEFAULT_TIMEOUT`` (unbounded for
  the names in the class's ``unbounded``);
- each sync method and property is passed through; other public attributes of the wrapped
  object (``store_id``) are read through.

Classmethods (the async class's openers) are not generated: a face writes its own
``create``/``connect``, which take a ``Cluster`` or a ``SyncCluster``. A member the face
defines itself is left alone. A blocking call from a thread that runs an event loop raises
RuntimeError (``portal.check_blocking_allowed``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from rayless.actors.api.portal import run_sync
from rayless.actors.api.sync import SyncCluster

if TYPE_CHECKING:
    from rayless.actors.api.cluster import Cluster

__all__ = ["DEFAULT_TIMEOUT", "SLACK", "BlockingFace", "call_limit", "public_members", "split"]

T = TypeVar("T")
F = TypeVar("F", bound="BlockingFace")
DEFAULT_TIMEOUT = 300.0
SLACK = 30.0  # beyond a call's own timeout, for the round trips around it
RENAMED = {"aclose": "close"}


def split(cluster: Cluster | SyncCluster | None) -> tuple[Cluster | None, SyncCluster | None]:
    """``(the async cluster, the SyncCluster whose portal runs calls, or None)``."""
    if isinstance(cluster, SyncCluster):
        return cluster.cluster, cluster
    return cluster, None


def block(sync: SyncCluster | None, aw: Awaitable[T], timeout: float | None) -> T:
    """Run ``aw`` on ``sync``'s portal (the home loop without one) and wait up to ``timeout``."""
    return sync.run(aw, timeout) if sync is not None else run_sync(aw, timeout)


def public_members(cls: type) -> dict[str, Any]:
    """The public methods and properties of ``cls`` and its bases (classmethods and
    staticmethods left out), by name."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, attr in vars(klass).items():
            if name.startswith("_"):
                continue
            if inspect.isfunction(attr) or isinstance(attr, property):
                out[name] = attr
            else:
                out.pop(name, None)
    return out


def call_limit(timeout: Any) -> float | None:
    """How long a call with its own ``timeout`` may block: None for None, else timeout plus
    SLACK (a bad value: DEFAULT_TIMEOUT, and the async method raises its own error)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        return DEFAULT_TIMEOUT
    return float(timeout) + SLACK


def _blocking(name: str, fn: Callable[..., Any], unbounded: bool) -> Callable[..., Any]:
    sig = inspect.signature(fn)
    timed = "timeout" in sig.parameters

    @functools.wraps(fn)
    def call(self: BlockingFace, *args: Any, **kwargs: Any) -> Any:
        limit = None if unbounded else DEFAULT_TIMEOUT
        if timed:
            bound = sig.bind(self._inner, *args, **kwargs)
            limit = call_limit(bound.arguments.get("timeout", sig.parameters["timeout"].default))
        return block(self._sync, getattr(self._inner, name)(*args, **kwargs), limit)

    return call


def _passed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(self: BlockingFace, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._inner, name)(*args, **kwargs)

    return call


def _read(name: str, prop: property) -> property:
    return property(lambda self: getattr(self._inner, name), doc=prop.__doc__)


class BlockingFace:
    """The blocking face of one async object; subclass with ``face=TheAsyncClass``. A context
    manager: leaving ``with`` runs ``close``."""

    face: ClassVar[type]
    unbounded: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, face: type | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if face is None:
            return
        cls.face = face
        for name, attr in public_members(face).items():
            own = RENAMED.get(name, name)
            if own in cls.__dict__:
                continue
            if isinstance(attr, property):
                setattr(cls, own, _read(name, attr))
            elif inspect.iscoroutinefunction(attr):
                setattr(cls, own, _blocking(name, attr, name in cls.unbounded))
            else:
                setattr(cls, own, _passed(name, attr))

    def __init__(self, inner: Any, sync: SyncCluster | None = None) -> None:
        self._inner = inner
        self._sync = sync

    def run(self, aw: Awaitable[T], timeout: float | None = DEFAULT_TIMEOUT) -> T:
        """Run any awaitable where this face runs its calls and wait up to ``timeout`` s
        (None: as long as it takes). Raises what ``aw`` raises, Timeout when it passes."""
        return block(self._sync, aw, timeout)

    @classmethod
    def _open(
        cls: type[F],
        cluster: Cluster | SyncCluster | None,
        opener: Callable[[Any], Awaitable[Any]],
    ) -> F:
        """A face over what ``opener(the async cluster)`` opens, run on ``cluster``'s portal
        (the home loop for a ``Cluster`` or None), within ``DEFAULT_TIMEOUT``."""
        inner, sync = split(cluster)
        return cls(block(sync, opener(inner), DEFAULT_TIMEOUT), sync)

    def __getattr__(self, name: str) -> Any:
        """A public attribute of the wrapped object (``store_id``, ``version``), read through."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def close(self) -> None:
        """End the wrapped object (its ``aclose``; generated where the face has one)."""

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

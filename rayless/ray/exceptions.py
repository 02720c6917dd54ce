"""Ray's exception classes, each raised in place of the rayless error it maps.

    RayError
    ├── RayTaskError          a task or actor method raised; the raised object is also an
    │                         instance of the user's exception class (Ray's ``as_instanceof_cause``)
    ├── RayActorError         the actor is gone
    │   └── ActorDiedError    ... with the death cause, pid, exit code and last log lines
    ├── WorkerCrashedError    a task's worker died more often than ``max_retries`` allow
    ├── GetTimeoutError       ``ray.get`` ran past its timeout (also a ``TimeoutError``)
    ├── TaskCancelledError    the task or call was cancelled (``ray.cancel``)
    ├── ObjectLostError       the ref belongs to a session that was shut down
    ├── OutOfMemoryError      the worker or actor was killed by the kernel's OOM killer
    └── ActorAlreadyExistsError  a named actor's name is taken (also a ``ValueError``)

The rest of Ray's exception classes are here too, in Ray's hierarchy, so that code which
names them (``except ray.exceptions.NodeDiedError``, NeMo-RL's table of infrastructure
errors) imports and runs; rayless raises none of them: ``RaySystemError``,
``ActorUnavailableError`` (a ``RayActorError``), ``ActorUnschedulableError``,
``TaskUnschedulableError``, ``NodeDiedError``, ``LocalRayletDiedError``, ``RpcError``,
``ObjectStoreFullError``, ``OutOfDiskError``, ``ObjectFetchTimedOutError``,
``OwnerDiedError``, ``ObjectFreedError``, ``ObjectReconstructionFailedError`` and
``ReferenceCountingAssertionError`` (each an ``ObjectLostError``), ``RuntimeEnvSetupError``,
``PendingCallsLimitExceeded``, ``AsyncioActorExit``, ``TaskPlacementGroupRemoved``,
``ActorPlacementGroupRemoved``, ``ActorHandleNotFoundError`` (also a ``ValueError``),
``CrossLanguageError``, ``PlasmaObjectNotAvailable``, ``ObjectRefStreamEndOfStreamError``,
``UnserializableException``, ``UserCodeException``, ``AuthenticationError``.

Each mapped error keeps the rayless one: ``err.cause`` of an ``ActorDiedError`` names the
death, ``err.log_tail`` the last lines of the actor's log, and ``__cause__`` is the original.
A mapped error is also an instance of the rayless class it came from (``except
rayless.errors.ActorDiedError`` still works).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import types
from typing import Any

from rayless.errors import ActorDiedError as _RaylessDied
from rayless.errors import NameTakenError, RaylessError, RemoteError, Timeout

__all__ = [
    "ActorAlreadyExistsError",
    "ActorDiedError",
    "ActorHandleNotFoundError",
    "ActorPlacementGroupRemoved",
    "ActorUnavailableError",
    "ActorUnschedulableError",
    "AsyncioActorExit",
    "AuthenticationError",
    "CrossLanguageError",
    "GetTimeoutError",
    "LocalRayletDiedError",
    "NodeDiedError",
    "ObjectFetchTimedOutError",
    "ObjectFreedError",
    "ObjectLostError",
    "ObjectReconstructionFailedError",
    "ObjectRefStreamEndOfStreamError",
    "ObjectStoreFullError",
    "OutOfDiskError",
    "OutOfMemoryError",
    "OwnerDiedError",
    "PendingCallsLimitExceeded",
    "PlasmaObjectNotAvailable",
    "RayActorError",
    "RayError",
    "RaySystemError",
    "RayTaskError",
    "ReferenceCountingAssertionError",
    "RpcError",
    "RuntimeEnvSetupError",
    "TaskCancelledError",
    "TaskPlacementGroupRemoved",
    "TaskUnschedulableError",
    "UnserializableException",
    "UserCodeException",
    "WorkerCrashedError",
    "map_error",
]


class RayError(Exception):
    """Root of Ray's errors."""


class RayTaskError(RayError):
    """A task or actor method raised. The object raised is also an instance of the user's
    exception class; ``cause`` is that exception (rayless' ``RemoteError``, with the remote
    traceback in its message)."""

    cause: BaseException | None = None

    def as_instanceof_cause(self) -> RayTaskError:
        """This error (it already is an instance of its cause's class)."""
        return self


class RayActorError(RayError):
    """The actor died (or could not start); every call to it fails with this."""

    actor_id: str | None = None
    error_msg: str = ""


class ActorDiedError(RayActorError):
    """The actor's process is gone: ``cause`` (the node agent's words: a signal, the OOM
    killer, an exit code), ``pid``, ``exitcode``, ``log_tail`` say how."""


class WorkerCrashedError(RayError):
    """A task's worker process died and the task's retries are spent."""


class GetTimeoutError(RayError, TimeoutError):
    """``ray.get`` or ``ray.wait`` ran past its timeout; the work goes on."""


class TaskCancelledError(RayError):
    """The task or actor call was cancelled with ``ray.cancel``."""


class ObjectLostError(RayError):
    """The object's owner is gone: the ref was made in a session that was shut down."""


class OutOfMemoryError(RayError):
    """The kernel's OOM killer ended the worker or actor that ran the task."""


class ActorAlreadyExistsError(ValueError, RayError):
    """A named actor's name is taken (also a ``ValueError``, as in Ray)."""


# Ray's other exception classes: defined so that code naming them runs; never raised here.


class RaySystemError(RayError):
    """Ray's internal error (never raised by rayless)."""


class ActorUnavailableError(RayActorError):
    """Ray: the actor is temporarily unreachable (never raised by rayless)."""


class ActorUnschedulableError(RayError):
    """Ray: the actor cannot be scheduled (rayless raises ``ActorDiedError`` with the
    ``PlacementError`` as its cause instead)."""


class TaskUnschedulableError(RayError):
    """Ray: the task cannot be scheduled (rayless raises the ``PlacementError``)."""


class NodeDiedError(RayError):
    """Ray: the node running the task died (rayless: ``WorkerCrashedError`` or
    ``ActorDiedError`` naming the node)."""


class LocalRayletDiedError(RayError):
    """Ray: the local raylet died (never raised by rayless)."""


class RpcError(RayError):
    """Ray: a gRPC call failed (never raised by rayless)."""


class ObjectStoreFullError(RayError):
    """Ray: the object store is full (rayless has no shared object store)."""


class OutOfDiskError(RayError):
    """Ray: the node's disk is full (never raised by rayless)."""


class ObjectFetchTimedOutError(ObjectLostError):
    """Ray: fetching an object timed out (never raised by rayless)."""


class OwnerDiedError(ObjectLostError):
    """Ray: the object's owner died (rayless raises ``ObjectLostError``)."""


class ObjectFreedError(ObjectLostError):
    """Ray: the object was freed (never raised by rayless)."""


class ObjectReconstructionFailedError(ObjectLostError):
    """Ray: the object could not be rebuilt (never raised by rayless)."""


class ReferenceCountingAssertionError(ObjectLostError, AssertionError):
    """Ray: the object was deleted while referenced (never raised by rayless)."""


class RuntimeEnvSetupError(RayError):
    """Ray: the runtime environment could not be set up (rayless refuses an unsupported
    ``runtime_env`` with ``ValueError`` before starting anything)."""


class PendingCallsLimitExceeded(RayError):
    """Ray: ``max_pending_calls`` was exceeded (accepted without effect by rayless)."""


class AsyncioActorExit(RayError):
    """Ray: raised inside an async actor by ``exit_actor`` (never raised by rayless)."""


class TaskPlacementGroupRemoved(RayError):
    """Ray: the task's placement group was removed (never raised by rayless)."""


class ActorPlacementGroupRemoved(RayError):
    """Ray: the actor's placement group was removed (rayless: ``ActorDiedError``)."""


class ActorHandleNotFoundError(ValueError, RayError):
    """Ray: the handle belongs to an earlier session (never raised by rayless)."""


class CrossLanguageError(RayError):
    """Ray: an error from another language's worker (never raised by rayless)."""


class PlasmaObjectNotAvailable(RayError):
    """Ray: the object is not in the local store (never raised by rayless)."""


class ObjectRefStreamEndOfStreamError(RayError):
    """Ray: a streaming generator has no more items (rayless ends the iteration)."""


class UnserializableException(RayError):
    """Ray: a remote exception could not be deserialised (rayless keeps it as a
    ``RayTaskError`` of a ``RemoteError``)."""


class UserCodeException(RayError):
    """Ray: an error in user code Ray wraps (never raised by rayless)."""


class AuthenticationError(RayError):
    """Ray: the cluster token was refused (rayless raises its ``AuthError``)."""


# (Ray's class, the error's class, the name shown) -> the class derived from both; a plain
# RemoteError's name is its remote type's, so each remote type has its own (bounded: past
# _MIXED_MAX, a class is made for the one error and not kept)
_MIXED: dict[tuple[type, type, str], type[BaseException]] = {}
_MIXED_MAX = 1024


def _mixed(ray_cls: type[BaseException], err: BaseException) -> BaseException:
    """``err`` as an instance of a class derived from ``ray_cls`` and ``type(err)``, with its
    args and attributes (no ``__init__`` runs). Falls back to ``ray_cls(str(err))``."""
    base = type(err)
    shown = str(getattr(err, "remote_type", None) or getattr(base, "__name__", "?"))
    key = (ray_cls, base, shown)
    cls: type[BaseException] | None = _MIXED.get(key)
    if cls is None:
        name = f"{ray_cls.__name__}({shown.rpartition('.')[2]})"
        kwds: dict[str, Any] = {"wire": None} if issubclass(base, RaylessError) else {}
        try:
            cls = types.new_class(name, (ray_cls, base), kwds)
            cls.__module__ = ray_cls.__module__
            cls.__str__ = base.__str__  # type: ignore[method-assign]
        except TypeError:  # layouts that cannot be combined
            cls = ray_cls
        if len(_MIXED) < _MIXED_MAX:
            _MIXED[key] = cls
    out: BaseException
    made = None if cls is ray_cls else _blank(cls)
    if made is None:
        out = ray_cls(str(err))
    else:
        out = made
        out.args = err.args
        try:
            out.__dict__.update(getattr(err, "__dict__", {}))
        except (AttributeError, TypeError):
            pass
    out.__cause__ = err
    out.__traceback__ = err.__traceback__
    return out


def _blank(cls: type[BaseException]) -> BaseException | None:
    """An instance of ``cls`` made without ``__init__``, or None where neither its own
    ``__new__`` nor ``BaseException``'s will make one (a builtin with a ``__new__`` of its
    own: ``MemoryError``'s refuses a class mixed with another base, ``OSError`` needs its)."""
    for new in (cls.__new__, BaseException.__new__):
        try:
            return new(cls)
        except TypeError:
            continue
    return None


def map_error(err: BaseException, *, task: bool = False) -> BaseException:
    """The Ray error to raise for rayless' ``err`` (itself where Ray has no counterpart).

    ``task``: the error ended a task's last retry on a dead worker (WorkerCrashedError).
    """
    if isinstance(err, RayError):
        return err
    if isinstance(err, (asyncio.CancelledError, concurrent.futures.CancelledError)):
        out = TaskCancelledError("the task was cancelled (ray.cancel)")
        out.__cause__ = err
        return out
    if isinstance(err, Timeout):
        return _mixed(GetTimeoutError, err)
    if isinstance(err, NameTakenError):
        return _mixed(ActorAlreadyExistsError, err)
    if isinstance(err, _RaylessDied):
        if "OOM" in (err.cause or ""):
            return _mixed(OutOfMemoryError, err)
        mapped = _mixed(WorkerCrashedError if task else ActorDiedError, err)
        if isinstance(mapped, RayActorError):
            mapped.actor_id = err.actor
            mapped.error_msg = str(err)
        return mapped
    if isinstance(err, RemoteError):
        mapped = _mixed(RayTaskError, err)
        if isinstance(mapped, RayTaskError):
            mapped.cause = err
        return mapped
    return err

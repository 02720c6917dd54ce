"""Ray's core API on rayless: ``from rayless import ray`` (or ``import rayless.ray as ray``)
moves a Ray program by changing one import. No Ray is installed or started.

    from rayless import ray

    ray.init(num_gpus=4)
    @ray.remote(num_gpus=0.5)
    class Worker: ...
    w = Worker.remote()
    print(ray.get(w.step.remote(1)))

What is supported, and every deliberate difference from Ray: docs/moving-from-ray.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import inspect
import json
import os
import tempfile
import time
from typing import Any

from rayless.ray import _worker, actor, exceptions, runtime_env, util
from rayless.ray._resources import available_resources, cluster_resources, nodes
from rayless.ray.actor import ActorClass, ActorHandle, from_rayless, method, remote_class
from rayless.ray.exceptions import GetTimeoutError
from rayless.ray.generator import ObjectRefGenerator
from rayless.ray.object_ref import ObjectRef, put_ref, snapshot
from rayless.ray.remote_function import RemoteFunction, task_state
from rayless.ray.runtime_context import RuntimeContext, get_runtime_context, gpu_ids

# The Ray release whose API this module follows (its parity tests run against it): what a
# program that prints or compares ``ray.__version__`` reads. rayless' own: rayless.__version__.
__version__ = "2.60.0"

__all__ = [
    "ActorClass",
    "ObjectRef",
    "ObjectRefGenerator",
    "RayContext",
    "RemoteFunction",
    "RuntimeContext",
    "actor",
    "available_resources",
    "cancel",
    "cluster_resources",
    "exceptions",
    "runtime_env",
    "get",
    "get_actor",
    "get_gpu_ids",
    "get_runtime_context",
    "init",
    "is_initialized",
    "kill",
    "method",
    "nodes",
    "put",
    "remote",
    "shutdown",
    "timeline",
    "util",
    "wait",
]

# ray.init keywords accepted without an effect (logging, dashboard, object store sizing)
_IGNORED_INIT = frozenset(
    {
        "include_dashboard",
        "dashboard_host",
        "dashboard_port",
        "logging_level",
        "logging_format",
        "log_to_driver",
        "configure_logging",
        "object_store_memory",
        "_temp_dir",
        "_system_config",
        "_metrics_export_port",
        "resources",
        "_node_ip_address",
        "runtime_env_setup_hook",
    }
)


class RayContext(dict[str, Any]):
    """What ``ray.init`` returns: ``address_info`` items, and ``with ray.init():`` shuts the
    session down at the end."""

    def __enter__(self) -> RayContext:
        return self

    def __exit__(self, *exc: object) -> None:
        shutdown()

    @property
    def address_info(self) -> dict[str, Any]:
        """The address of the head (``address``, ``gcs_address``)."""
        return dict(self)

    @property
    def dashboard_url(self) -> None:
        """None: ``rayless dashboard`` serves the dashboard."""
        return None


def init(
    address: str | None = None,
    *,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    namespace: str | None = None,
    ignore_reinit_error: bool = False,
    runtime_env: dict[str, Any] | None = None,
    local_mode: bool = False,
    _num_nodes: int = 1,
    **kwargs: Any,
) -> RayContext:
    """Start an embedded local cluster (default) or join one (``address="auto"`` or
    ``"host:port"``; also the cluster ``rayless launch`` names in the environment).

    ``num_gpus`` on a local cluster gives each node that many GPUs (fake ones where the
    machine has fewer, as rayless' local clusters do); ``_num_nodes`` (rayless only) starts a
    local cluster of several nodes. In an actor or task the session is the actor's cluster; in
    a driver that already started or joined a cluster itself (``actors.Cluster.local_sync``)
    it is that cluster (``ray.shutdown`` then leaves it running).

    Raises:
        RuntimeError: already initialized (unless ``ignore_reinit_error``).
        ValueError: unsupported keywords or ``runtime_env`` keys, ``local_mode=True``.
        ConnectError / StartError: no cluster to join, or the local one did not start.
    """
    unknown = sorted(set(kwargs) - _IGNORED_INIT)
    if unknown:
        raise ValueError(f"ray.init() got unsupported keywords {unknown} (rayless.ray)")
    if local_mode:
        raise ValueError("local_mode is not supported by rayless.ray: tasks always run remotely")
    with _worker._lock:
        s = _worker.current()
        if s is not None:
            if ignore_reinit_error or _worker.in_actor():
                return _context(s)
            raise RuntimeError(
                "Maybe you called ray.init twice by accident? This error can be suppressed by "
                "passing in 'ignore_reinit_error=True' or by calling 'ray.shutdown()' prior to "
                "'ray.init()'."
            )
        if address in (None, "local") and os.environ.get("RAYLESS_ADDRESS") and address is None:
            address = "auto"
        s = _worker.open_session(
            None if address == "local" else address,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            namespace=namespace,
            runtime_env=runtime_env,
            num_nodes=_num_nodes,
        )
    return _context(s)


def _context(s: _worker.Session) -> RayContext:
    address = s.sync.address if s.sync is not None else s.joined
    address = address or os.environ.get("RAYLESS_ADDRESS", "")
    return RayContext(
        address=address, gcs_address=address, node_ip_address=util.get_node_ip_address()
    )


def shutdown() -> None:
    """End the session: its actors and task workers die, a local cluster stops. A script
    that never calls it ends the same way at exit."""
    _worker.close_session()


def is_initialized() -> bool:
    """Whether ``ray.init`` ran (always True inside an actor or task)."""
    return _worker.current() is not None or _worker.in_actor()


def remote(*args: Any, **options: Any) -> Any:
    """``@ray.remote`` / ``@ray.remote(**options)`` on a class (an actor class) or a
    function (a remote function).

    Raises:
        TypeError: it decorates something else, or is given positional options.
        ValueError: an unsupported option (named).
    """
    if len(args) == 1 and not options and callable(args[0]):
        return _make(args[0], {})
    if args:
        raise TypeError(
            "The @ray.remote decorator must be applied either with no arguments "
            "and no parentheses, or with keyword arguments only"
        )
    return lambda obj: _make(obj, options)


def _make(obj: Any, options: dict[str, Any]) -> Any:
    if inspect.isclass(obj):
        return remote_class(obj, options)
    if callable(obj):
        return RemoteFunction(obj, options)
    raise TypeError("The @ray.remote decorator must be applied to either a function or a class.")


def _ref(value: Any) -> ObjectRef:
    if type(value) is ObjectRef:
        return value
    if isinstance(value, (asyncio.Future, concurrent.futures.Future)):  # a rayless call's
        return ObjectRef(value, _worker.session().generation)
    raise TypeError(
        f"Attempting to call `get` on the value {value!r:.80}, which is not an ray.ObjectRef."
    )


def get(object_refs: Any, *, timeout: float | None = None) -> Any:
    """The value of a ref, or the values of a list of refs in order (the first error, in
    that order, is raised).

    Raises:
        GetTimeoutError: not ready within ``timeout`` seconds (0: a probe); the work goes on.
        RayTaskError: the task or method raised (also an instance of its exception).
        RayActorError / ActorDiedError, TaskCancelledError, WorkerCrashedError, ObjectLostError.
        ValueError: ``object_refs`` is not a ref or a list of refs.
    """
    if type(object_refs) is ObjectRef:
        return _get_one(object_refs, timeout)
    if isinstance(object_refs, (list, tuple)):
        if timeout is None:
            return [_get_one(_ref(r), None) for r in object_refs]
        deadline = time.monotonic() + timeout
        return [_get_one(_ref(r), max(0.0, deadline - time.monotonic())) for r in object_refs]
    if isinstance(object_refs, (asyncio.Future, concurrent.futures.Future)):
        return _get_one(_ref(object_refs), timeout)
    raise ValueError(
        "'object_refs' must either be an ObjectRef or a list of ObjectRefs, got "
        f"{type(object_refs).__name__}"
    )


def _get_one(ref: ObjectRef, timeout: float | None) -> Any:
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
    s = _worker.current()
    if s is None or s.generation != ref._generation:
        ref.check_alive()
    try:
        return ref.result(timeout)
    except concurrent.futures.TimeoutError as exc:
        if isinstance(exc, exceptions.RayError):  # the call's own TimeoutError, mapped
            raise
        raise GetTimeoutError(
            f"Get timed out: some object(s) not ready within {timeout} s"
        ) from None


def wait(
    object_refs: list[Any],
    *,
    num_returns: int = 1,
    timeout: float | None = None,
    fetch_local: bool = True,
) -> tuple[list[Any], list[Any]]:
    """``(ready, not_ready)`` once ``num_returns`` refs are done or ``timeout`` passed (0: a
    probe). ``ready`` holds at most ``num_returns``, the first done ones in the order given;
    ``not_ready`` all the others, in the order given. An ``ObjectRefGenerator`` is ready
    once its next ref is (``next(gen)`` returns at once; a finished one is ready too).

    Raises:
        TypeError: ``object_refs`` is not a list of refs and generators.
        ValueError: duplicate refs, ``num_returns`` out of range, a negative timeout.
    """
    if not isinstance(object_refs, (list, tuple)):
        raise TypeError(f"wait() expected a list of ray.ObjectRef, got {type(object_refs)}")
    if len({id(_identity(r)) for r in object_refs}) != len(object_refs):
        raise ValueError("Wait requires a list of unique object refs.")
    refs = [_wait_ref(r) for r in object_refs]
    if not refs:
        return [], []
    if num_returns <= 0:
        raise ValueError(f"Invalid number of objects to return {num_returns}.")
    if num_returns > len(refs):
        raise ValueError(
            "num_returns cannot be greater than the number of objects provided to ray.wait."
        )
    if timeout is not None and timeout < 0:
        raise ValueError(f"The 'timeout' argument must be nonnegative. Received {timeout}")
    pending = [r for r in refs if not r._future.done()]
    if len(refs) - len(pending) < num_returns and timeout != 0 and pending:
        futs = {_waitable(r): r for r in pending}
        deadline = None if timeout is None else time.monotonic() + timeout
        done_count = len(refs) - len(pending)
        waiting = set(futs)
        while done_count < num_returns and waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0:
                break
            newly, waiting = concurrent.futures.wait(
                waiting, timeout=left, return_when=concurrent.futures.FIRST_COMPLETED
            )
            done_count += len(newly)
    ready: list[Any] = []
    rest: list[Any] = []
    for original, r in zip(object_refs, refs, strict=True):
        (ready if len(ready) < num_returns and r._future.done() else rest).append(original)
    return ready, rest


def _identity(x: Any) -> Any:
    """What makes two entries of ``ray.wait``'s list the same: a ref's value, a generator."""
    return x._future if isinstance(x, ObjectRef) else x


def _wait_ref(x: Any) -> ObjectRef:
    """``x`` as a ref ``ray.wait`` waits on: a generator's is done once its next ref is."""
    if isinstance(x, ObjectRefGenerator):
        return ObjectRef(x._ready_future(), x._s.generation)
    return _ref(x)


def _waitable(ref: ObjectRef) -> concurrent.futures.Future[Any]:
    fut = ref._future
    if isinstance(fut, concurrent.futures.Future):
        return fut
    s = _worker.current()
    if s is not None and _worker.on_loop(s):
        raise RuntimeError(
            "ray.wait inside an async actor method would block the actor's event loop for "
            "good: use `await asyncio.wait([...])` on the refs there"
        )
    return ref.future()


def put(value: Any, *, _owner: Any = None) -> ObjectRef:
    """A ref holding a copy of ``value`` made now (later changes to ``value`` are not seen, as
    in Ray). Passed as a top-level argument it travels with the call (tensors and numpy
    arrays by rayless' zero-copy same-host path); ``ray.get`` returns the copy.

    Raises:
        TypeError: ``value`` is an ObjectRef (as Ray).
    """
    if isinstance(value, ObjectRef):
        raise TypeError("Calling 'put' on an ray.ObjectRef is not allowed.")
    return put_ref(snapshot(value), _worker.session().generation)


def cancel(ref: ObjectRef, *, force: bool = False, recursive: bool = True) -> None:
    """Cancel the task or actor call of ``ref``: a queued one is dropped, a running async
    method is cancelled, a running sync function or method runs to its end (``force=True``
    kills a task's worker instead). ``ray.get(ref)`` then raises TaskCancelledError.

    Raises:
        TypeError: ``ref`` is not an ObjectRef.
        ValueError: ``force=True`` for an actor call (as Ray).
    """
    if type(ref) is not ObjectRef:
        raise TypeError(f"ray.cancel() only supported for object refs, got {type(ref)}")
    fut = ref._future
    if fut.done():
        return
    state = task_state(ref)
    if force:
        if state is None:
            raise ValueError("force=True is not supported for actor tasks.")
        worker = state.worker
        if worker is not None:
            state.force = True
            s = _worker.session()
            _worker.submit(s, _kill_quietly(s, worker.handle))
            return
    if isinstance(fut, asyncio.Future):
        fut.get_loop().call_soon_threadsafe(fut.cancel)
    else:
        fut.cancel()


async def _kill_quietly(s: _worker.Session, handle: Any) -> None:
    cluster = await s.cluster()
    try:
        await cluster.kill(handle)
    except Exception:
        pass


def kill(actor: Any, *, no_restart: bool = True) -> None:
    """Kill the actor at once: its pending and later calls fail with ActorDiedError.

    Raises:
        ValueError: not an actor handle; ``no_restart=False`` for an actor with
            ``max_restarts`` (rayless' kill is always for good).
    """
    if not isinstance(actor, ActorHandle):
        raise ValueError(
            "ray.kill() only supported for actors. For tasks, try ray.cancel(). "
            f"Got: {type(actor)}."
        )
    if not no_restart and type(actor) is ActorHandle and actor._opts.get("max_restarts"):
        raise ValueError(
            "ray.kill(no_restart=False) is not supported by rayless.ray: a kill is always for "
            "good (the actor is not restarted)"
        )
    s = _worker.session()
    _worker.run(s, _kill(s, actor))


async def _kill(s: _worker.Session, actor: Any) -> None:
    try:
        inner = await actor._resolved() if type(actor) is ActorHandle else actor
    except Exception:  # it never started (its constructor raised...): as Ray, nothing to do
        return
    cluster = await s.cluster()
    await cluster.kill(inner)
    where = s.placements.pop(inner.actor_id, None)
    if where is not None:
        where.release()


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    """The live actor called ``name`` (in ``namespace``, default the session's).

    Raises:
        ValueError: no live actor has that name.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("Please supply a non-empty value to get_actor")
    s = _worker.session()
    qualified = actor.qualified_name(s, name, namespace)

    async def look() -> Any:
        cluster = await s.cluster()
        return await cluster.get_actor(qualified)

    try:
        return from_rayless(_worker.run(s, look()))
    except ValueError:
        raise ValueError(
            f"Failed to look up actor with name '{name}'. This could because 1. You are trying "
            "to look up a named actor you didn't create. 2. The named actor died."
        ) from None


def timeline(filename: str | None = None) -> list[dict[str, Any]] | None:
    """The cluster's timeline (rayless' Chrome trace events of every live actor and this
    process: ``Cluster.timeline``): written to ``filename``, else returned as a list of
    events (as Ray's).

    Raises:
        RuntimeError: ``ray.init()`` has not been called.
    """
    s = _worker.current()
    if s is None:
        raise RuntimeError(
            "Ray has not been started yet. Timeline requires Ray to be initialized first."
        )

    async def write(path: str) -> None:
        cluster = await s.cluster()
        await cluster.timeline(path)

    if filename is not None:
        _worker.run(s, write(filename))
        return None
    with tempfile.TemporaryDirectory(prefix="rayless-timeline-") as tmp:
        path = os.path.join(tmp, "timeline.json")
        _worker.run(s, write(path))
        with open(path) as f:
            events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return events


def __getattr__(name: str) -> Any:
    """``ray.cloudpickle`` (the cloudpickle module) and ``ray._private`` (a few of Ray's
    private functions), imported at first use."""
    if name == "cloudpickle":
        import cloudpickle

        return cloudpickle
    if name == "_private":
        return importlib.import_module("rayless.ray._private")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_gpu_ids() -> list[int]:
    """The GPUs this actor or task may use (``CUDA_VISIBLE_DEVICES``); [] in a driver
    without GPUs."""
    return gpu_ids()

"""The actor process: fetch the spec from the node agent, build the actor, serve its calls.

Started by the zygote (a fork) or, without one, as ``python -m rayless.actors.host.process``.
It serves calls on its own ROUTER socket; async methods run concurrently on its loop (at most
``max_concurrency`` at once), sync methods in worker threads: one at a time, or up to
``max_concurrency`` at once when the actor was spawned with it (``actors.host.workers``).
A method in a concurrency group (``@concurrency_group``) runs under that group's limit
instead, a ``def`` one on threads of the group's own: Ray's concurrency groups; a call may
name its own group (a fifth field of its body: ``("c", method, args, kwargs, group)``).
A caller that gives up (timeout, cancel) cancels its call here: an async method's task is
cancelled, a queued sync call is dropped, a running one finishes without its slot. It exits
when told to (SIGTERM: ``teardown`` runs), or when its node agent goes away.

Liveness never depends on user code yielding the loop: the agent learns of the actor's death
by reaping its pid, callers from the head's events, and the actor watches its agent's pid from
a thread. An ``async def`` method that holds the loop is reported, not punished: a warning
names the method and the seconds (``RAYLESS_LOOP_WARN_S``, default 2 s; 0 turns it off).

The cluster token is read from the environment once and removed from it, so processes the
actor starts (reward sandboxes, compilers) never see it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from rayless.actors.api.actor import (
    _CALLER,
    ClassRef,
    by_value,
    class_name,
    dumps_by_value,
    loads_by_value,
    set_current_handle,
    set_self_call_check,
)
from rayless.actors.api.binding import CALL, EXIT, READY, check_groups, public_methods
from rayless.actors.api.handle import ActorHandle
from rayless.actors.api.portal import set_home_loop
from rayless.actors.api.streams import CLOSE, NEXT, StreamHost, is_stream
from rayless.actors.control import debug
from rayless.actors.control.process_util import setup_logging
from rayless.actors.core import context, gc_policy, timeline
from rayless.actors.core.callstats import STATS
from rayless.actors.core.result_hooks import HOOKS as RESULT_HOOKS
from rayless.actors.core.result_hooks import pending_waits
from rayless.actors.core.threads import apply_torch_threads, torch_threads
from rayless.actors.errors import StartError
from rayless.actors.host.workers import Exiting as _Exiting
from rayless.actors.host.workers import Later, SyncWorker
from rayless.actors.protocol.messages import Boot, Bootstrap, Failed, MethodInfo, Ready
from rayless.actors.protocol.wire import ask
from rayless.transport import codec, loop
from rayless.transport.client import Client
from rayless.transport.errors import ProtocolError, RaylessError, RemoteError
from rayless.transport.peer import Peer
from rayless.transport.protocol import pickle_allowed
from rayless.transport.server import Request, Server

DEFAULT_MAX_CONCURRENCY = 1000


def remote_error(exc: BaseException, actor: str) -> RaylessError:
    """``exc`` as something that crosses the wire: rayless errors as they are, others wrapped.

    The wrapper keeps the exception's args and plain public attributes; an exception class
    of the driver's ``__main__`` (which arrived by value) travels by value with it, so a
    caller that cannot find it by name still rebuilds it.
    """
    if isinstance(exc, RaylessError):
        return exc
    pickled = None
    if by_value(type(exc)):
        try:
            pickled = dumps_by_value(type(exc))
        except TypeError:
            pickled = None  # the caller gets a plain RemoteError
    return RemoteError.from_exception(exc, actor, pickled)


def exit_code(exc: SystemExit) -> int:
    """The process exit code ``sys.exit(code)`` asks for (as the interpreter computes it)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr, flush=True)
    return 1


class LoopMonitor:
    """Reports an event loop held longer than ``threshold`` seconds, from a thread.

    The loop ticks every ``threshold / 4``; the thread warns when a tick is late, naming the
    async methods running at that moment and where the loop's thread is (the innermost frame
    of user code), then again every 10 s while the loop stays held, and once more with the
    total when the loop comes back. A hold that is rayless' own import of a module on its
    first use (torch, for the first tensor a light actor decodes) is reported as such, not
    as the user's.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str, threshold: float) -> None:
        self.loop = loop
        self.name = name
        self.threshold = threshold
        self.running: dict[int, tuple[str, float]] = {}  # id(task) -> (method, started)
        self._tick = time.monotonic()
        self._loop_thread: int | None = None  # the thread that runs the loop
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"loopmon-{name}", daemon=True)

    def start(self) -> None:
        """Start ticking on the loop and watching from the thread."""
        self._ticker()
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread."""
        self._stopped.set()

    def _ticker(self) -> None:
        self._tick = time.monotonic()
        self._loop_thread = threading.get_ident()
        if not self._stopped.is_set():
            self.loop.call_later(self.threshold / 4, self._ticker)

    def _methods(self) -> str:
        now = time.monotonic()
        names = [f"{m!r} (running {now - t:.1f} s)" for m, t in list(self.running.values())]
        return ", ".join(names) if names else "no async method (a callback or `setup`)"

    def _where(self) -> tuple[str, bool]:
        """Where the loop's thread is now (``at file:line in function``, or ``importing
        module``), and whether that is rayless' own import of a module on its first use."""
        frame = sys._current_frames().get(self._loop_thread or -1)
        stack: list[FrameType] = []
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        stack.reverse()  # outermost first
        for i, f in enumerate(stack):
            if not f.f_code.co_filename.startswith("<frozen importlib"):
                continue
            callers = [c for c in stack[:i] if _module(c) != "importlib"]
            caller = callers[-1] if callers else None
            bodies = [_module(g) for g in stack[i:] if g.f_code.co_name == "<module>"]
            what = f"importing {bodies[0].split('.')[0]}" if bodies else "importing a module"
            if caller is not None and _module(caller).startswith("rayless."):
                return what, True
            return (f"{what} {_at(caller)}" if caller is not None else what), False
        user = [f for f in stack if not _module(f).startswith(_RUNTIME_MODULES)]
        return (_at(user[-1]) if user else ""), False

    def _watch(self) -> None:
        blocked_since: float | None = None
        next_report = 0.0
        while not self._stopped.wait(self.threshold / 4):
            now = time.monotonic()
            held = now - self._tick
            if held > self.threshold:
                if blocked_since is None:
                    blocked_since, next_report = self._tick, now
                if now >= next_report:
                    where, ours = self._where()
                    if ours:
                        _warn(
                            f"actor {self.name}: event loop held for {held:.1f} s by rayless "
                            f"{where} (its first use in this process); the actor answers "
                            "nothing meanwhile"
                        )
                    else:
                        _warn(
                            f"actor {self.name}: event loop held for {held:.1f} s by "
                            f"{self._methods()}{' ' + where if where else ''}; the actor "
                            "stays alive but answers nothing meanwhile (run long work in a "
                            "`def` method or `await asyncio.to_thread(...)`)"
                        )
                    next_report = now + 10.0
            elif blocked_since is not None:
                _warn(f"actor {self.name}: event loop free again after {now - blocked_since:.1f} s")
                blocked_since = None


# modules whose frames are the loop's machinery, never where user code holds it
_RUNTIME_MODULES = ("asyncio", "selectors", "threading", "rayless.", "concurrent.")


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


def _at(frame: FrameType) -> str:
    return f"at {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _warn(text: str) -> None:
    print(f"rayless: warning: {text}", file=sys.stderr, flush=True)


def watch_parent(pid: int, on_gone: Callable[[], None]) -> threading.Thread | None:
    """Call ``on_gone`` from a thread once process ``pid`` (the node agent) has exited.

    Uses a pidfd where the kernel has them (no polling, no pid reuse), else polls every
    0.5 s. Returns the thread, or None when ``pid`` is not a valid pid.
    """
    if pid <= 0:
        return None

    def run() -> None:
        fd = -1
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = -1
        try:
            if fd >= 0:
                import select

                select.select([fd], [], [])
            else:
                while True:
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    except PermissionError:
                        pass
                    time.sleep(0.5)
        finally:
            if fd >= 0:
                os.close(fd)
        on_gone()

    thread = threading.Thread(target=run, name="agent-watch", daemon=True)
    thread.start()
    return thread


class ActorHost:
    """Holds one actor instance and answers calls to it."""

    def __init__(
        self,
        spec: Boot,
        name: str,
        token: str,
        bind_ip: str,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.spec = spec
        self.stop = stop  # set when a method calls sys.exit; ``exit_code`` is then its code
        self.exit_code = 0
        self.name = name
        self.token = token
        self.bind_ip = bind_ip
        self.instance: Any = None
        self.methods: dict[str, MethodInfo] = {}
        self.worker: SyncWorker | None = None
        self.worker_loop = asyncio.get_running_loop()  # where sync methods report an exit
        limit = spec.max_concurrency
        self.semaphore = asyncio.Semaphore(int(limit or DEFAULT_MAX_CONCURRENCY))
        # def methods: one at a time unless max_concurrency was given (Ray's threaded actors)
        self.sync_concurrency = int(limit or 1)
        self.server: Server | None = None
        self.monitor: LoopMonitor | None = None
        self.streams: StreamHost | None = None  # results of generator methods
        # concurrency group -> its limit on async calls and the threads of its def calls
        self.groups: dict[str, tuple[asyncio.Semaphore, SyncWorker]] = {}
        # the instance is built and set up: calls its constructor made on its own handle
        # wait for this (``_when_built``)
        self.serving = False
        self._built = asyncio.Event()

    async def start(self) -> str:
        """Build the instance, run ``setup``, start serving; returns the address."""
        loop = asyncio.get_running_loop()
        self.worker = SyncWorker(loop, self.name, torch_threads(), self.sync_concurrency)
        for group, limit in self.spec.concurrency_groups.items():
            worker = SyncWorker(loop, f"{self.name}-{group}", torch_threads(), limit)
            self.groups[group] = (asyncio.Semaphore(limit), worker)
        self.streams = StreamHost(
            loop, self.worker.submit, lambda exc: remote_error(exc, self.name)
        )
        STATS.watch(self)  # the queue depth of the cluster's metrics
        threshold = _float_env("RAYLESS_LOOP_WARN_S", 2.0)
        if threshold > 0:
            self.monitor = LoopMonitor(loop, self.name, threshold)
            self.monitor.start()
        for path in reversed(self.spec.sys_path):  # the driver's import path
            if path not in sys.path and os.path.isdir(path):
                sys.path.insert(0, path)
        cls = ClassRef.from_wire(self.spec.cls).load()
        args, kwargs = codec.decode(self.spec.init, allow_pickle=pickle_allowed())
        self.methods = public_methods(cls, self.spec.hooks)
        # the class as loaded here may differ from the driver's: a group it names must exist
        check_groups(class_name(cls), self.methods, self.spec.concurrency_groups)
        # listening before the instance is built: its constructor may take its own handle
        # (Ray's current_actor); only this process knows the address until start returns
        self.server = Server(
            f"tcp://{self.bind_ip}:0",
            token=self.token,
            handler=self.dispatch,
            name=self.name,
            cancellable=True,  # a caller that gives up cancels its call here
            on_peer_gone=self._peer_gone,
        )
        await self.server.start()
        self.streams.handle = ActorHandle(
            os.environ.get(context.ENV_ACTOR_ID, self.name),
            self.name,
            self.server.address,
            class_name(cls),
            self.methods,
            os.environ.get(context.ENV_NODE_ID),
        )
        set_current_handle(self.streams.handle)
        set_self_call_check(self._self_call_blocks)
        try:
            self.instance = await self.worker.submit(functools.partial(cls, *args, **kwargs))
            if self.spec.hooks:
                await self._lifecycle("setup")
            self.serving = True
        finally:
            self._built.set()
        return self.server.address

    async def _lifecycle(self, name: str) -> None:
        method = getattr(self.instance, name, None)
        if method is None:
            return
        if asyncio.iscoroutinefunction(method):
            await method()
        elif self.worker is not None and not self.worker.exited:
            await self.worker.submit(method)
        else:  # a call ended the actor and stopped the worker: teardown still runs
            await asyncio.to_thread(method)

    def dispatch(self, req: Request) -> Any:
        """Route one call to the instance (an awaitable for the server to finish)."""
        if not self.serving:
            return self._when_built(req)
        body = req.body
        if type(body) is not tuple or len(body) not in (4, 5) or body[0] != "c":
            return self._stream_step(body)
        method, args, kwargs = body[1], body[2], body[3]
        info = self.methods.get(method) if isinstance(method, str) else None
        if info is None:
            if method in (READY, EXIT) and not args and not kwargs:
                return self._builtin(method, req)
            if method == CALL and args and type(args[0]) is bytes:
                return self._call_function(args, kwargs, req)
            missing = AttributeError(
                f"actor {self.name!r} ({class_name(type(self.instance))}) has no public "
                f"method {method!r}"
            )
            raise remote_error(missing, self.name)
        group = info.group
        if len(body) == 5:  # the call's own group (Ray's .options(concurrency_group=))
            group = body[4]
            if group not in self.groups:
                unknown = ValueError(
                    f"actor {self.name!r} has no concurrency group {group!r} (its groups: "
                    f"{', '.join(sorted(self.groups)) or 'none'})"
                )
                raise remote_error(unknown, self.name)
        STATS.call(method)
        fn = getattr(self.instance, method)
        return self._start(fn, info.is_async, args, kwargs, req, group)

    def _self_call_blocks(self, method: str, group: str | None) -> bool:
        """Whether this thread waiting for its own actor's call of ``method`` in ``group``
        waits for good: the call is a ``def`` method that needs this very thread (its group
        runs one call at a time, on the thread now waiting)."""
        info = self.methods.get(method)
        if info is None or info.is_async:
            return False
        group = info.group if group is None else group
        worker = self.worker if group is None else self.groups.get(group, (None, None))[1]
        return worker is not None and worker.concurrency == 1 and worker.on_own_thread()

    async def _when_built(self, req: Request) -> Any:
        """A call made before the instance was built (by its constructor, through its own
        handle): routed once it is built and set up.

        Raises:
            RemoteError: the constructor or ``setup`` failed (the actor is ending).
        """
        await self._built.wait()
        if not self.serving:
            failed = RuntimeError(f"actor {self.name!r} failed to start")
            raise remote_error(failed, self.name)
        result = self.dispatch(req)
        return await result if inspect.isawaitable(result) else result

    def _start(
        self,
        fn: Any,
        is_async: bool,
        args: Any,
        kwargs: Any,
        req: Request,
        group: str | None = None,
    ) -> Any:
        """Run ``fn`` for the call ``req``: an async one as a task of this loop, a sync one
        queued on the worker thread behind the sync calls sent before it (never answered once
        a call ended the actor: its callers learn of the exit); in concurrency group
        ``group``'s limit and threads where given."""
        caller = req.peer.routing_id.hex()
        # recording a timeline: the request (the flow's ends) and when the call was queued
        traced = req if timeline.RECORDER.enabled else None
        queued = time.time_ns() if traced is not None else 0
        semaphore, worker = self.semaphore, self.worker
        if group is not None:
            semaphore, worker = self.groups[group]
        if is_async:
            return self._run_async(fn, args, kwargs, caller, traced, queued, semaphore)
        assert worker is not None  # internal invariant: set by start()
        if worker.exited:
            return _no_reply()
        return worker.submit(  # a def generator's later steps run on the same threads
            functools.partial(
                self._run_sync, fn, args, kwargs, caller, traced, queued, worker.submit
            )
        )

    def _builtin(self, method: str, req: Request) -> Any:
        """``READY`` or ``EXIT``, queued behind the sync calls sent before it."""
        return self._start(_ready if method == READY else _terminate, False, (), {}, req)

    def _call_function(self, args: Any, kwargs: Any, req: Request) -> Any:
        """``CALL``: the caller's function (``args[0]``, pickled by value) run on the instance
        with the other arguments: queued behind the sync calls sent before it, or, an ``async
        def``, awaited on the actor's loop as an async method is.

        Raises:
            RemoteError: the function could not be unpickled here (a module it needs is
                missing in this process, say).
        """
        try:
            fn = loads_by_value(args[0])
        except Exception as exc:
            raise remote_error(exc, self.name) from None
        instance = self.instance
        if inspect.iscoroutinefunction(fn):

            async def awaited(*a: Any, **k: Any) -> Any:
                return await fn(instance, *a, **k)

            awaited.__name__ = CALL
            return self._start(awaited, True, tuple(args[1:]), kwargs, req)

        def called(*a: Any, **k: Any) -> Any:
            return fn(instance, *a, **k)

        called.__name__ = CALL
        return self._start(called, False, tuple(args[1:]), kwargs, req)

    def _stream_step(self, body: Any) -> Any:
        """A pull from, or the close of, a streamed result (``actors.api.streams``)."""
        assert self.streams is not None  # internal invariant: set by start()
        if type(body) is tuple and len(body) == 3 and body[0] == NEXT:
            return self.streams.pull(body[1], body[2])
        if type(body) is tuple and len(body) == 2 and body[0] == CLOSE:
            return self.streams.close(body[1])
        raise ProtocolError(f"malformed call {body!r:.100}")

    def _peer_gone(self, peer: Peer) -> None:
        """Tell the instance (its ``_caller_gone`` hook, if any) that a connection is gone,
        and close the streams it was reading."""
        if self.streams is not None:
            self.streams.caller_gone(peer.routing_id.hex())
        hook = getattr(self.instance, "_caller_gone", None)
        if callable(hook):
            hook(peer.routing_id.hex())

    async def _run_async(
        self,
        fn: Any,
        args: Any,
        kwargs: Any,
        caller: str,
        traced: Request | None,
        queued: int,
        semaphore: asyncio.Semaphore,
    ) -> Any:
        _CALLER.set(caller)  # this call's task has a context of its own
        async with semaphore:
            key = id(asyncio.current_task())
            if self.monitor is not None:
                self.monitor.running[key] = (fn.__name__, time.monotonic())
            start = time.time_ns() if traced is not None else 0
            error: BaseException | None = None
            waits: list[Awaitable[None]] = []
            try:
                result = await fn(*args, **kwargs)
                if RESULT_HOOKS:
                    waits = pending_waits(result)
                if not waits:
                    if is_stream(result):
                        assert self.streams is not None  # internal invariant: set by start()
                        return self.streams.open(result, caller)
                    return result
            except SystemExit as exc:
                error = exc
                self.exit(fn.__name__, exit_code(exc))
            except asyncio.CancelledError as exc:
                error = exc
                raise
            except BaseException as exc:  # KeyboardInterrupt, GeneratorExit...: a reply too
                error = exc
                STATS.error(fn.__name__, exc)
                raise remote_error(exc, self.name) from None
            finally:
                if self.monitor is not None:
                    self.monitor.running.pop(key, None)
                if traced is not None:
                    _record(fn, queued, start, "async", error, traced)
                error = None  # no cycle (this frame -> the error -> its traceback -> this frame)
        if waits:  # the slot is free: a wait may be for a later call to this actor
            return await _after(waits, result)
        await asyncio.Future()  # no reply: the caller learns of the exit (ActorDiedError)

    def _run_sync(
        self,
        fn: Any,
        args: Any,
        kwargs: Any,
        caller: str,
        traced: Request | None,
        queued: int,
        steps: Any,
    ) -> Any:
        reset = _CALLER.set(caller)
        start = time.time_ns() if traced is not None else 0
        error: BaseException | None = None
        try:
            result = fn(*args, **kwargs)
            if RESULT_HOOKS:
                waits = pending_waits(result)
                if waits:  # answered from the loop once they are done; this thread goes on
                    return Later(_after(waits, result))
            if is_stream(result):
                assert self.streams is not None  # internal invariant: set by start()
                return self.streams.open(result, caller, steps)
            return result
        except SystemExit as exc:
            error = exc
            self.worker_loop.call_soon_threadsafe(self.exit, fn.__name__, exit_code(exc))
            raise _Exiting from None
        except BaseException as exc:  # KeyboardInterrupt, GeneratorExit...: a reply too
            error = exc
            STATS.error(fn.__name__, exc)
            raise remote_error(exc, self.name) from None
        finally:
            _CALLER.reset(reset)
            if traced is not None:
                _record(fn, queued, start, threading.get_ident(), error, traced)
            error = None  # no cycle (this frame -> the error -> its traceback -> this frame)

    def exit(self, method: str, code: int) -> None:
        """A method called ``sys.exit(code)``: end the actor as Ray's ``exit_actor`` does.

        Its callers (this one included) get ActorDiedError with ``code`` once the node agent
        has reaped the process; ``max_restarts`` apply.
        """
        if self.stop is None or self.stop.is_set():
            return
        if method != EXIT:  # asked for by a caller: nothing to warn of
            _warn(f"actor {self.name}: method {method!r} called sys.exit({code}); exiting")
        self.exit_code = code
        self.stop.set()

    async def aclose(self, grace: float = 10.0) -> None:
        """Close open streams, run ``teardown`` (bounded by ``grace``), stop serving, stop the
        worker thread."""
        if self.streams is not None:
            self.streams.close_all()
        if self.instance is not None and self.spec.hooks:
            try:
                await asyncio.wait_for(self._lifecycle("teardown"), grace)
            except Exception:
                traceback.print_exc()
        if self.server is not None:
            await self.server.aclose()
        if self.worker is not None:
            self.worker.stop()
        for _, worker in self.groups.values():
            worker.stop()
        if self.monitor is not None:
            self.monitor.stop()


async def _after(waits: list[Awaitable[None]], result: Any) -> Any:
    """``result``, once what the result hooks wait for is done."""
    for wait in waits:
        await wait
    return result


async def _no_reply() -> None:
    """A call that arrived after the actor chose to exit: never answered (the caller gets
    ActorDiedError once the process is gone)."""
    await asyncio.Future()


def _ready() -> bool:
    return True


def _terminate() -> None:
    raise SystemExit(0)


_ready.__name__ = READY
_terminate.__name__ = EXIT


def _record(
    fn: Any, queued: int, start: int, lane: int | str, error: BaseException | None, req: Request
) -> None:
    """Append a method's run of request ``req`` to the timeline (``timeline.METHOD``;
    ``lane``: its thread's ident, or ``"async"``)."""
    timeline.RECORDER.spans.append(
        (
            timeline.METHOD,
            fn.__name__,
            queued,
            time.time_ns(),
            start,
            lane,
            None if error is None else timeline.error_text(error),
            req.peer.trace_key,
            req.req_id,
        )
    )


def _float_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


async def _actor_main(given: str | None) -> int:
    env = os.environ
    actor_id = env[context.ENV_ACTOR_ID]
    name = env.get(context.ENV_ACTOR_NAME, actor_id)
    # kept in memory only (RAYLESS_TOKEN_FD's pipe, or the zygote's fork request): children
    # never inherit it, and it never was in this process's environment
    token = given or context.take_token()
    if not token:
        raise StartError(f"actor {name}: no cluster token (RAYLESS_TOKEN_FD)")
    head = env.get(context.ENV_ADDRESS, "")
    context.set_current(context.ClusterInfo(head, token, session=actor_id, actor_id=actor_id))
    apply_torch_threads(torch_threads())
    timeline.RECORDER.reset()  # RAYLESS_TIMELINE as this actor's environment says (after a fork)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    set_home_loop(loop)  # `.call()` from the sync methods' worker thread runs here
    debug.install(name, actor_id, token, env.get(context.ENV_NODE_IP, "127.0.0.1"), head, loop)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)

    def agent_gone() -> None:  # from the watcher thread, whatever the loop is doing
        print(f"actor {name}: node agent lost, exiting", file=sys.stderr, flush=True)
        try:
            loop.call_soon_threadsafe(stop.set)
        except RuntimeError:
            pass
        time.sleep(_float_env("RAYLESS_KILL_GRACE", 10.0))  # teardown's time, then go
        os._exit(1)

    watch_parent(int(env.get(context.ENV_AGENT_PID, "0") or 0), agent_gone)
    agent = Client(
        env[context.ENV_AGENT_ADDRESS],
        token=token,
        name=f"actor:{name}",
        heartbeat_interval=0.5,
        heartbeat_timeout=5.0,
    )
    await agent.connect()
    host: ActorHost | None = None
    try:
        spec = await ask(agent, Bootstrap(actor_id), timeout=60)
        host = ActorHost(spec, name, token, env.get(context.ENV_NODE_IP, "127.0.0.1"), stop)
        try:
            address = await host.start()
        except BaseException as exc:
            traceback.print_exc()
            await ask(agent, Failed(actor_id, remote_error(exc, name)), timeout=10)
            return 1
        # the class's methods as loaded here: the handles everyone gets are strict about them
        gc_policy.freeze()  # the class, its instance and what setup loaded stay
        await ask(agent, Ready(actor_id, address, os.getpid(), host.methods), timeout=10)
        debug.announce()  # `rayless debug`/`stack` find this actor's listener from now on
        # From here the agent is watched by pid (watch_parent), never by heartbeats: a method
        # that holds this loop for minutes must not look like a lost agent.
        await agent.aclose()
        await stop.wait()
        return host.exit_code
    finally:
        if host is not None:
            await host.aclose()
        await agent.aclose()
        from rayless.actors.api.runtime import close_runtimes

        await close_runtimes()


def child_main(token: str | None = None) -> int:
    """Run the actor described by the environment, with ``token`` (the zygote's) or the one
    of RAYLESS_TOKEN_FD; returns the exit code."""
    setup_logging(f"actor {os.environ.get(context.ENV_ACTOR_NAME, '?')}")
    gc_policy.apply()
    return loop.run(_actor_main(token))


if __name__ == "__main__":
    sys.exit(child_main())

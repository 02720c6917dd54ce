"""Every builtin exception raised in an actor reaches the caller as a RemoteError, and the
caller survives.

The StopIteration-like ones run in a driver of their own (a subprocess), so a crash of the
caller fails the test instead of killing pytest: a ``RemoteError[StopIteration]`` delivered
through a Future into nested coroutines killed the driver with SIGSEGV (CPython 3.11 reads a
StopIteration leaving an awaited object as "finished"), and a MemoryError was never answered
(``MemoryError.__new__(RemoteError[MemoryError]) is not safe`` raised while the reply was
handled, after the call's timer was cancelled, so its ``timeout`` never fired either).
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rayless.actors import Cluster, RemoteError
from rayless.actors.launch.local import LocalProcesses
from tests.integration.error_classes import (
    ODD,
    FailsInInit,
    NoSubclassErr,
    OddRaiser,
    Raiser,
    builtin_error,
)
from tests.waiting import timeout_scale

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

ALL = sorted(
    {
        v.__name__
        for v in vars(builtins).values()
        if isinstance(v, type) and issubclass(v, BaseException)
    }
)
# Types the interpreter gives a meaning to: they stay plain RemoteErrors (SystemExit ends the
# actor instead); each one runs in a driver of its own.
SPECIAL = {
    "StopIteration",
    "StopAsyncIteration",
    "GeneratorExit",
    "KeyboardInterrupt",
    "SystemExit",
    "BaseExceptionGroup",
    "ExceptionGroup",
}
COMBINED = [name for name in ALL if name not in SPECIAL]


@pytest.mark.parametrize("name", COMBINED)
async def test_a_builtin_exception_arrives_as_itself_and_a_remote_error(
    local_cluster: Cluster, name: str
) -> None:
    raiser = await local_cluster.spawn(Raiser)
    original = builtin_error(name)
    with pytest.raises(RemoteError) as info:
        await asyncio.wait_for(raiser.raise_builtin(name), 60 * timeout_scale())
    err = info.value
    assert isinstance(err, type(original)), type(err).__mro__
    assert err.remote_type == f"builtins.{type(original).__name__}"
    assert str(original) in err.remote_message
    assert "raise builtin_error(name)" in err.remote_traceback
    if isinstance(original, OSError):
        assert isinstance(err, OSError)
        assert (err.errno, err.strerror, err.filename) == (2, f"a {name}", "/no/such/path")
    elif isinstance(original, UnicodeError) and hasattr(original, "start"):
        assert (err.start, err.end, err.reason) == (original.start, original.end, original.reason)
    elif isinstance(original, SyntaxError):
        assert (err.filename, err.lineno, err.offset) == ("f.py", 3, 5)
    else:
        assert err.args == original.args
    assert await raiser.ok() == 1  # the actor survived


@pytest.mark.parametrize("name", ["MemoryError", "KeyError", "StopIteration"])
async def test_a_constructor_error_arrives_as_itself(local_cluster: Cluster, name: str) -> None:
    """A MemoryError in a constructor (a worker group's too) arrived as a TypeError."""
    with pytest.raises(RemoteError) as info:
        await asyncio.wait_for(local_cluster.spawn(FailsInInit, name), 60 * timeout_scale())
    err = info.value
    assert err.remote_type == f"builtins.{name}" and "raise builtin_error(name)" in str(err)
    assert isinstance(err, getattr(builtins, name)) == (name != "StopIteration")


@pytest.mark.parametrize("kind", sorted(ODD))
async def test_odd_user_exceptions_arrive_and_nothing_breaks(
    local_cluster: Cluster, kind: str
) -> None:
    """Classes whose constructor needs other arguments or raises, whose ``__new__`` returns
    something else, whose ``__reduce__``/``__str__``/``__init_subclass__`` raise."""
    raiser = await local_cluster.spawn(OddRaiser)
    original = ODD[kind]()
    with pytest.raises(RemoteError) as info:
        await asyncio.wait_for(raiser.raise_odd(kind), 60 * timeout_scale())
    err = info.value
    assert err.remote_type.endswith(type(original).__qualname__)
    assert "raise ODD[kind]()" in err.remote_traceback
    assert isinstance(err, type(original)) == (type(original) is not NoSubclassErr)
    if kind == "bad_str":
        assert "str() raised ValueError" in err.remote_message
    else:
        assert err.args == original.args and str(original) in err.remote_message
    if kind in ("kw_only", "slots", "bad_setter"):
        assert err.code == original.code if kind != "bad_setter" else err.level == 3
    for copied in (copy.deepcopy(err), pickle.loads(pickle.dumps(err))):
        assert type(copied) is type(err) and copied.args == err.args
    assert await raiser.ok() == 1


def _own_driver(procs: LocalProcesses, method: str, arg: str | None) -> dict[str, Any]:
    """Call ``Raiser.<method>(arg)`` from a driver process of its own; what it caught."""
    script = """
import asyncio, json, sys
from rayless import actors
from rayless.actors import ActorDiedError, RemoteError
from tests.integration.error_classes import Raiser

async def main(address, token, method, arg):
    async with actors.connect(address, token=token) as cluster:
        raiser = await cluster.spawn(Raiser)
        call = getattr(raiser, method)
        try:
            await asyncio.wait_for(call(arg) if arg else call(), 60)
            out = {"returned": True}
        except BaseException as exc:
            out = {
                "mro": [c.__name__ for c in type(exc).__mro__],
                "remote": isinstance(exc, RemoteError),
                "died": isinstance(exc, ActorDiedError),
                "remote_type": getattr(exc, "remote_type", None),
                "message": getattr(exc, "remote_message", str(exc)),
                "traceback": getattr(exc, "remote_traceback", ""),
            }
        try:
            out["alive"] = await asyncio.wait_for(raiser.ok(), 60) == 1
        except ActorDiedError:
            out["alive"] = False
    print(json.dumps(out))

asyncio.run(main(*sys.argv[1:4], sys.argv[4] if len(sys.argv) > 4 else None))
print("driver survived")
"""
    args = [sys.executable, "-X", "faulthandler", "-c", script, procs.address, procs.token, method]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*args, *([arg] if arg else [])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180 * timeout_scale(),
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines[-1:] == ["driver survived"], (
        f"the driver exited {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    )
    result: dict[str, Any] = json.loads(lines[-2])
    return result


@pytest.mark.parametrize("name", sorted(SPECIAL & set(ALL)))  # no groups before 3.11
def test_special_builtins_never_take_the_caller_down(
    local_cluster_processes: LocalProcesses, name: str
) -> None:
    out = _own_driver(local_cluster_processes, "raise_builtin", name)
    if name == "SystemExit":  # ends the actor, as sys.exit() does
        assert out["died"] and not out["alive"]
        return
    assert out["remote"] and out["mro"][0] == "RemoteError"  # a plain one, not the original
    original = builtin_error(name)
    assert out["remote_type"] == f"builtins.{type(original).__name__}"
    assert str(original) in out["message"]
    assert "raise builtin_error(name)" in out["traceback"]
    assert out["alive"]


def test_next_on_an_exhausted_iterator_in_a_method(
    local_cluster_processes: LocalProcesses,
) -> None:
    out = _own_driver(local_cluster_processes, "stop_iteration", None)
    assert out["remote"] and out["remote_type"] == "builtins.StopIteration"
    assert "StopIteration" not in out["mro"] and "return next(iter([]))" in out["traceback"]
    assert out["alive"]


def test_stop_iteration_in_an_async_method_is_a_runtime_error(
    local_cluster_processes: LocalProcesses,
) -> None:
    """Python's own rule: StopIteration leaving a coroutine becomes a RuntimeError."""
    out = _own_driver(local_cluster_processes, "araise_builtin", "StopIteration")
    assert out["remote"] and out["remote_type"] == "builtins.RuntimeError"
    assert "RuntimeError" in out["mro"] and "coroutine raised StopIteration" in out["message"]
    assert out["alive"]

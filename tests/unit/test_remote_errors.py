"""Remote exceptions on the wire: args, attributes, by-value classes, never a BaseException.

Before (issue 13): ``KeyError('k')`` arrived with ``args[0] == 'builtins.KeyError'``,
attributes were lost, a class of the driver's ``__main__`` was not rebuilt, and a remote
``SystemExit`` was rebuilt as a SystemExit (the caller exited silently).
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

from rayless.actors.api.actor import dumps_by_value
from rayless.actors.api.remote_errors import caller_hook, materialize, replied
from rayless.actors.errors import ActorDiedError, ClusterLostError
from rayless.transport.codec import decode, encode
from rayless.transport.errors import BrokenError, RemoteError, Timeout


def _wire(exc: BaseException, remote_class: bytes | None = None) -> RemoteError:
    """``exc`` as an actor sends it and a caller rebuilds it."""
    sent = RemoteError.from_exception(exc, actor="a", remote_class=remote_class)
    received = decode([bytes(f) for f in encode(sent)])
    assert type(received) is RemoteError
    return materialize(received)


class Coded(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.blob = object()


def test_args_and_plain_public_attributes_travel() -> None:
    err = _wire(KeyError("k"))
    assert isinstance(err, KeyError) and err.args[0] == "k"
    coded = _wire(Coded(42, "msg"))
    assert isinstance(coded, Coded) and isinstance(coded, RemoteError)
    assert coded.args == (42, "msg") and coded.code == 42 and not hasattr(coded, "blob")
    assert coded.remote_type.endswith("Coded") and coded.actor == "a"
    assert "Remote traceback" in str(_wire(_raised(Coded(1, "m"))))
    odd = _wire(ValueError({1}, 2))
    assert odd.args == ("{1}", 2)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize("kind", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_no_base_exception_reaches_the_caller_as_itself(kind: type[BaseException]) -> None:
    err = _wire(kind(3))
    assert type(err) is RemoteError and not isinstance(err, kind)
    assert err.args == (3,)


def test_a_class_of_main_is_rebuilt_by_value() -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(  # a class of a driver's __main__ that this process cannot find by name
        "class ByValueErr(Exception):\n"
        "    def __init__(self, code):\n"
        "        super().__init__(code)\n"
        "        self.code = code\n",
        namespace,
    )
    cls = namespace["ByValueErr"]
    assert cls.__module__ == "__main__"
    err = _wire(cls(7), remote_class=dumps_by_value(cls))
    assert isinstance(err, cls) and isinstance(err, RemoteError) and err.code == 7
    plain = _wire(cls(7))  # without its class: a plain RemoteError that names it
    assert type(plain) is RemoteError and plain.remote_type == "__main__.ByValueErr"
    broken = _wire(cls(7), remote_class=b"not a pickle")
    assert type(broken) is RemoteError


class KwOnly(Exception):
    def __init__(self, *, code: int) -> None:
        super().__init__(code)
        self.code = code


class NoReduce(Exception):
    def __reduce__(self) -> Any:
        raise RuntimeError("not picklable")


def _copies(err: BaseException) -> list[BaseException]:
    return [copy.deepcopy(err), copy.copy(err), pickle.loads(pickle.dumps(err))]


@pytest.mark.parametrize(
    "exc", [KeyError("k"), Coded(3, "m"), KwOnly(code=4), NoReduce("n"), OSError(2, "nf", "/p")]
)
def test_remote_errors_deep_copy_and_pickle(exc: BaseException) -> None:
    err = _wire(_raised(exc))
    assert isinstance(err, type(exc)) and isinstance(err, RemoteError)
    for back in _copies(err):
        assert type(back) is type(err) and back is not err
        assert back.args == err.args and str(back) == str(err)
        assert back.remote_traceback == err.remote_traceback and back.actor == "a"
        assert vars(back) == vars(err)
    plain = RemoteError.from_exception(_raised(ValueError("v")), actor="b")
    for back in _copies(plain):
        assert type(back) is RemoteError and str(back) == str(plain)


def test_rayless_errors_with_keyword_only_init_deep_copy_and_pickle() -> None:
    died = ActorDiedError("w", pid=3, exitcode=-9, reason="killed")
    for back in _copies(died):
        assert type(back) is ActorDiedError and str(back) == str(died)
        assert (back.pid, back.exitcode) == (3, -9)


@pytest.mark.parametrize("kind", [StopIteration, StopAsyncIteration, MemoryError, RecursionError])
def test_interpreter_sensitive_types(kind: type[BaseException]) -> None:
    err = _wire(_raised(kind("x")))
    if kind in (StopIteration, StopAsyncIteration):  # never one the interpreter acts on
        assert type(err) is RemoteError and err.remote_type == f"builtins.{kind.__name__}"
    else:
        assert isinstance(err, kind) and isinstance(err, RemoteError) and err.args == ("x",)


def test_lost_peer_errors_an_actor_replies_with_are_noted_as_its_outcome() -> None:
    died = ActorDiedError("b", pid=7, node="n1", reason="gone")
    assert isinstance(died, BrokenError)  # the lost-peer family
    back = decode([bytes(f) for f in encode(died)])
    assert type(back) is ActorDiedError and (back.actor, back.pid, back.node) == ("b", 7, "n1")
    assert not replied(died)  # raised here: a break the runtime looks into
    for lost in (died, ClusterLostError("head gone"), BrokenError("peer gone")):
        assert caller_hook(lost) is lost and replied(lost)  # an actor's reply: its outcome
    assert not replied(BrokenError("peer gone"))
    timeout = Timeout("slow")  # a method's own deadline ran out: its outcome too
    assert caller_hook(timeout) is timeout and replied(timeout)
    assert not replied(Timeout("slow"))  # raised here: this call's deadline
    assert isinstance(caller_hook(RemoteError.from_exception(KeyError("k"), "a")), KeyError)

"""What a call does with its arguments before it is sent: Ray's habits, in rayless terms.

* A future passed as an argument (the future of another actor call, ``handle.f(x)`` or
  ``handle.f.remote(x)``, or any asyncio/concurrent future) is awaited first and its result
  sent in its place, as Ray resolves an ObjectRef argument. Only top-level arguments and
  keyword arguments are resolved (Ray does the same: refs nested in a list stay refs). The
  cost: the call leaves only once the future is done, and the value travels through the
  caller (actor → caller → actor; Ray's object store sends it actor → actor). Cancelling
  the call does not cancel the futures passed to it: other calls may wait for them too.
* An argument that cannot be encoded raises TypeError naming it in the caller's terms
  (``argument 0 ['a'][1]: cannot encode set``, ``keyword argument 'x': ...``), not by the
  wire message's internal path.
* A call whose message is bigger than the actor accepts (its limits, advertised in the
  handshake) raises LimitError before anything is sent, naming its largest argument.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping
from typing import Any

from rayless.transport.errors import LimitError

_FUTURES = (asyncio.Future, concurrent.futures.Future)


def has_futures(args: tuple[Any, ...], kwargs: Mapping[str, Any] | None) -> bool:
    """Whether a top-level argument is a future (then :func:`resolve_futures` first)."""
    for value in args:
        if isinstance(value, _FUTURES):
            return True
    if kwargs:
        for value in kwargs.values():
            if isinstance(value, _FUTURES):
                return True
    return False


async def _result(value: Any) -> Any:
    # shielded: cancelling the call that waits for it never cancels the user's own future
    # (Ray: cancelling a task leaves the ObjectRefs passed to it alone)
    if isinstance(value, concurrent.futures.Future):
        return await asyncio.shield(asyncio.wrap_future(value))
    if isinstance(value, asyncio.Future):
        return await asyncio.shield(value)
    return value


async def resolve_futures(
    args: tuple[Any, ...], kwargs: Mapping[str, Any] | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` with every top-level future replaced by its result (awaited
    together).

    Raises:
        whatever a future raised (the call is then not sent).
    """
    named = dict(kwargs or {})
    values = await asyncio.gather(*map(_result, args), *map(_result, named.values()))
    return tuple(values[: len(args)]), dict(zip(named, values[len(args) :], strict=True))


def call_encode_error(exc: TypeError, method: str, args_at: str = "[2]") -> TypeError:
    """An encoding error of a call's wire body, naming the argument in the caller's terms.

    ``args_at`` is the path part of the positional arguments in the body (the keyword
    arguments follow it); errors of other shapes come back unchanged.
    """
    path = getattr(exc, "path", None)
    reason = getattr(exc, "reason", None)
    if not isinstance(path, tuple) or not isinstance(reason, str) or len(path) < 2:
        return exc
    kwargs_at = f"[{int(args_at[1:-1]) + 1}]"
    rest = "".join(path[2:])
    where = f" {rest}" if rest else ""
    if path[0] == args_at:
        what = f"argument {path[1][1:-1]}{where}"
    elif path[0] == kwargs_at:
        what = f"keyword argument {path[1][1:-1]}{where}"
    else:
        return exc
    if reason in ("cannot encode Future", "cannot encode Task") and path[2:]:
        reason += (
            " (a future inside a list or dict is not awaited: only a future passed as an"
            " argument of its own is; await it first)"
        )
    error = TypeError(f"{what}: {reason} (calling {method})")
    error.path, error.reason = path, reason  # type: ignore[attr-defined]
    return error


def call_limit_error(
    exc: LimitError, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None
) -> LimitError:
    """A size error of a call's message, naming its largest argument (by payload bytes)."""
    sizes = [(f"argument {i}", _nbytes(v, 0)) for i, v in enumerate(args)]
    sizes += [(f"keyword argument {k!r}", _nbytes(v, 0)) for k, v in (kwargs or {}).items()]
    if not sizes:
        return exc
    what, size = max(sizes, key=lambda item: item[1])
    return LimitError(f"{what} of {method}(...) holds {size} bytes: {exc}")


def _nbytes(value: Any, depth: int) -> int:
    """The payload bytes of ``value`` (buffers, strings, arrays, nested containers)."""
    if depth > 100:
        return 0
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    nbytes = getattr(value, "nbytes", None)  # tensors, numpy arrays
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, (list, tuple, set, frozenset)):
        return sum(_nbytes(v, depth + 1) for v in value)
    items = getattr(value, "items", None)  # dicts, TensorDicts
    if callable(items):
        try:
            return sum(_nbytes(k, depth + 1) + _nbytes(v, depth + 1) for k, v in items())
        except Exception:
            return 0
    return 0

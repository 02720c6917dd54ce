"""``rayless debug`` and ``rayless stack``: reach into live actors (Ray's ``ray debug`` and
``ray stack``).

    rayless debug                 wait for an actor at breakpoint(), attach this terminal
    rayless debug --list          print the paused actors and exit
    rayless stack learner         every thread's and asyncio task's stack of actor "learner"
    rayless stack                 the same for every live actor (and driver, see below)
    rayless stack driver          the drivers' (those that run a debug listener)

The cluster is named as for ``rayless status`` (``--address``/``--token-file``, the
environment, or the one local cluster published on this host). Both ask the head for the
actors' debug listeners (``actors.control.debug``) and talk to them directly, authenticated
with the cluster token both ways. ``rayless debug`` attaches to the one paused breakpoint (or
asks which, when several are); in the session ``c`` continues the method and ends the
session, Ctrl-D or Ctrl-C detaches (the method continues too), ``q`` raises BdbQuit in it.
``rayless stack --py-spy`` uses ``py-spy dump`` instead (native frames too; the actor must
run on this host and py-spy be installed); without it, py-spy is the fallback when an actor's
listener does not answer (its GIL held by native code). A driver runs a listener too while
it records a timeline (unless RAYLESS_TIMELINE=0) or with RAYLESS_DEBUG=1: ``rayless stack`` lists
it as ``driver (pid P)``; its ``breakpoint()`` stays its terminal's own pdb.

Exit codes: 0 on success; 1 with a one-line message (no such actor, wrong token, no head);
2 when some actors asked for gave nothing (``rayless stack``: the stacks gathered are printed
and each missing actor is named on stderr with why, e.g. its debug listener is busy;
``rayless debug --list``: a busy actor's breakpoints could not be listed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from rayless.actors.api import status
from rayless.actors.control.debug import LineSocket, open_actor
from rayless.actors.errors import DebugBusyError
from rayless.actors.protocol.messages import (
    ActorState,
    DebugEndpoints,
    GetActor,
    LookupActor,
)
from rayless.actors.protocol.wire import ask
from rayless.transport.errors import AuthError, RaylessError
from rayless.transport.errors import Timeout as TransportTimeout

if TYPE_CHECKING:
    from rayless.transport.client import Client

POLL = 0.2


class DebugCliError(Exception):
    """A failure reported as one line and exit code 1."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``rayless debug``'s options to ``parser``."""
    status.add_cluster_arguments(parser)
    parser.add_argument("name", nargs="?", help="attach only to this actor's breakpoints")
    parser.add_argument("--list", action="store_true", help="print the paused actors and exit")
    parser.add_argument(
        "--wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long to wait for an actor to reach breakpoint() (default: until Ctrl-C)",
    )


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``rayless stack``'s options to ``parser``."""
    status.add_cluster_arguments(parser)
    parser.add_argument("name", nargs="?", help="the actor (default: every live actor)")
    parser.add_argument(
        "--py-spy", action="store_true", help="use py-spy dump (the actor must run on this host)"
    )


# -- talking to the head and the actors ----------------------------------------------------


@contextlib.asynccontextmanager
async def _head(address: str, token: str, timeout: float) -> AsyncIterator[Client]:
    """A connected client of the head; its errors become DebugCliError naming the head.

    Raises:
        DebugCliError: the head did not answer, or rejected the token.
    """
    from rayless.transport.client import Client

    client = Client(address, token=token, name="rayless-debug", connect_timeout=timeout)
    try:
        await client.connect()
        yield client
    except AuthError:
        raise DebugCliError(f"the head at {address} rejected the token (wrong token?)") from None
    except (TransportTimeout, asyncio.TimeoutError):
        raise DebugCliError(f"no answer from the head at {address} within {timeout:g}s") from None
    except RaylessError as exc:
        raise DebugCliError(f"{type(exc).__name__} from the head at {address}: {exc}") from None
    finally:
        await client.aclose()


async def endpoints(
    address: str, token: str, timeout: float, *, drivers: bool = False
) -> list[dict[str, Any]]:
    """Every live actor's record with its ``debug_address`` (with ``drivers``, the drivers
    that run a listener too: ``kind: "driver"``, named ``driver``).

    Raises:
        DebugCliError: the head did not answer, or rejected the token.
    """
    async with _head(address, token, timeout) as client:
        return await ask(client, DebugEndpoints(drivers=drivers), timeout=timeout)


async def exists(address: str, token: str, name: str, timeout: float) -> bool:
    """Whether the head knows a live or starting actor whose name or id is ``name``.

    Raises:
        DebugCliError: the head did not answer, or rejected the token.
    """
    from rayless.actors.errors import ActorNotFoundError

    async with _head(address, token, timeout) as client:
        lookups: tuple[GetActor | LookupActor, ...] = (GetActor(name), LookupActor(name))
        for lookup in lookups:
            try:
                record = await ask(client, lookup, timeout=timeout)
            except ActorNotFoundError:
                continue
            if record.state is not ActorState.DEAD:
                return True
    return False


def read_all(conn: LineSocket) -> str:
    """Everything the listener sends until it closes."""
    chunks = [conn.buffer]
    while True:
        chunk = conn.sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
    conn.sock.close()
    return b"".join(chunks).decode("utf-8", "replace")


def paused(
    records: list[dict[str, Any]], token: str, timeout: float, busy: set[str] | None = None
) -> list[dict[str, Any]]:
    """The breakpoints paused in these actors: ``{"actor": record, **pause}`` each; the names
    of actors whose listener was busy are added to ``busy``."""
    found = []
    for record in records:
        try:
            pauses = json.loads(read_all(open_actor(record, token, "list", timeout)) or "[]")
        except DebugBusyError:
            if busy is not None:
                busy.add(str(record["name"]))
            continue
        except (OSError, ValueError, RaylessError):
            continue  # gone meanwhile, or not answering: not paused at a breakpoint we know
        found += [{"actor": record, **p} for p in pauses]
    return found


def _describe(p: dict[str, Any]) -> str:
    since = time.strftime("%H:%M:%S", time.localtime(float(p.get("since", 0))))
    actor = f"{p['actor']['name']} ({p['actor']['node_id']})"
    return f"{actor} in {p['function']} at {p['where']} since {since}"


# -- rayless debug -------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Run ``rayless debug``; returns the exit code."""
    try:
        address, token = status.resolve(args)
        timeout = float(args.timeout)
        deadline = None if args.wait is None else time.monotonic() + float(args.wait)
        said = False
        told_busy: set[str] = set()
        while True:
            records = asyncio.run(endpoints(address, token, timeout, drivers=True))
            if args.name:
                records = [r for r in records if args.name in (r["name"], r["actor_id"])]
            busy: set[str] = set()
            found = paused(records, token, timeout, busy)
            for name in sorted(busy - told_busy):
                print(
                    f"rayless debug: {name}'s debug listener is busy (its handshake slots are "
                    "taken): its breakpoints cannot be listed now",
                    file=sys.stderr,
                    flush=True,
                )
            told_busy |= busy
            if found or args.list:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise DebugCliError(f"no actor reached breakpoint() within {args.wait:g}s")
            if not said:
                print("waiting for an actor to reach breakpoint() (Ctrl-C to stop)", flush=True)
                said = True
            time.sleep(POLL)
        if args.list:
            for i, p in enumerate(found, 1):
                print(f"{i}  {_describe(p)}")
            if not found:
                print("(no actor is paused at a breakpoint)")
            return 2 if busy else 0
        choice = found[0] if len(found) == 1 else _choose(found)
        return attach(choice, token, timeout)
    except (DebugCliError, status.StatusError) as exc:
        print(f"rayless debug: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _choose(found: list[dict[str, Any]]) -> dict[str, Any]:
    for i, p in enumerate(found, 1):
        print(f"{i}  {_describe(p)}")
    while True:
        answer = input(f"attach to which (1-{len(found)})? ").strip()
        if answer.isdigit() and 1 <= int(answer) <= len(found):
            return found[int(answer) - 1]


def attach(pause: dict[str, Any], token: str, timeout: float) -> int:
    """Relay this terminal to a paused breakpoint's pdb until the session ends.

    Raises:
        DebugCliError: the breakpoint is gone (continued, or another client attached).
    """
    try:
        conn = open_actor(pause["actor"], token, f"attach {pause['id']}", timeout)
        ready = conn.readline()
    except (OSError, RaylessError) as exc:
        raise DebugCliError(f"cannot attach to {pause['actor']['name']}: {exc}") from None
    if not ready.startswith("READY"):
        raise DebugCliError(f"cannot attach to {pause['actor']['name']}: {ready}")
    print(f"attached to {_describe(pause)}; 'c' continues, Ctrl-D detaches", flush=True)
    sock = conn.sock
    sock.settimeout(None)
    out = sys.stdout.buffer
    if conn.buffer:
        out.write(conn.buffer)
        out.flush()
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    stdin_fd = sys.stdin.fileno()
    sel.register(stdin_fd, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in sel.select():
                if key.fileobj is sock:
                    data = sock.recv(65536)
                    if not data:
                        print("\n(session ended: the actor continues)", flush=True)
                        return 0
                    out.write(data)
                    out.flush()
                else:
                    data = os.read(stdin_fd, 4096)
                    if data:
                        sock.sendall(data)
                    else:  # Ctrl-D: detach; the actor's pdb continues and closes
                        sel.unregister(stdin_fd)
                        sock.shutdown(socket.SHUT_WR)
    except KeyboardInterrupt:
        print("\n(detached: the actor continues)", flush=True)
        return 0
    except OSError:
        return 0
    finally:
        sel.close()
        sock.close()


# -- rayless stack -------------------------------------------------------------------------


def _local(address: str) -> bool:
    host = address.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    if host in ("127.0.0.1", "::1", "localhost"):
        return True
    try:
        import psutil

        return any(a.address == host for addrs in psutil.net_if_addrs().values() for a in addrs)
    except Exception:
        return False


def py_spy(record: dict[str, Any]) -> str:
    """``py-spy dump`` of the actor's process.

    Raises:
        DebugCliError: py-spy is not installed, the actor is on another host, or it failed.
    """
    exe = shutil.which("py-spy")
    if exe is None:
        raise DebugCliError("py-spy is not installed (pip install py-spy)")
    if not _local(str(record["debug_address"])):
        raise DebugCliError(f"{record['name']} runs on {record['node_id']}: run py-spy there")
    out = subprocess.run(
        [exe, "dump", "--pid", str(record["pid"])], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        raise DebugCliError(f"py-spy failed: {(out.stderr or out.stdout).strip()[:300]}")
    return out.stdout


def stack_of(record: dict[str, Any], token: str, timeout: float, use_py_spy: bool) -> str:
    """The text of one actor's stacks (py-spy's when asked, or when the listener is silent)."""
    if use_py_spy:
        return py_spy(record)
    try:
        return read_all(open_actor(record, token, "stack", timeout))
    except AuthError as exc:
        raise DebugCliError(f"{record['name']}: {exc}") from None
    except (OSError, RaylessError) as exc:
        if shutil.which("py-spy") and _local(str(record["debug_address"])):
            return py_spy(record)
        if isinstance(exc, DebugBusyError):
            raise DebugCliError(f"{record['name']}: {exc}") from None
        raise DebugCliError(f"{record['name']}'s debug listener does not answer: {exc}") from None


def run_stack(args: argparse.Namespace) -> int:
    """Run ``rayless stack``; returns the exit code."""
    try:
        address, token = status.resolve(args)
        timeout = float(args.timeout)
        deadline = time.monotonic() + timeout
        first_miss = True
        while True:
            records = asyncio.run(endpoints(address, token, timeout, drivers=True))
            if args.name:
                records = [r for r in records if args.name in (r["name"], r["actor_id"])]
            if records or not args.name:
                break
            if first_miss:  # no such actor at all: say so now, not after the timeout
                first_miss = False
                if not asyncio.run(exists(address, token, args.name, timeout)):
                    raise DebugCliError(f"no live actor named {args.name!r}")
            if time.monotonic() > deadline:  # a new actor registers its listener shortly
                raise DebugCliError(f"no live actor named {args.name!r}")
            time.sleep(POLL)
        texts, missing = [], []
        for record in records:
            try:
                texts.append(stack_of(record, token, timeout, args.py_spy))
            except DebugCliError as exc:
                missing.append(str(exc))
        if texts or not missing:
            print("\n\n".join(texts) if texts else "(no actors)", flush=True)
        for line in missing:
            print(f"rayless stack: no stack of {line}", file=sys.stderr)
        return 2 if missing else 0
    except (DebugCliError, status.StatusError) as exc:
        print(f"rayless stack: {exc}", file=sys.stderr)
        return 1

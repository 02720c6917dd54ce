"""``rayless status``: print a running cluster's nodes, GPUs, actors and restarts.

    rayless status --address tcp://10.0.0.1:7000 --token-file ~/.rayless/token
    RAYLESS_ADDRESS=tcp://... RAYLESS_TOKEN_FILE=... rayless status --json

The address comes from ``--address`` or RAYLESS_ADDRESS; the token from ``--token``,
``--token-file``, RAYLESS_TOKEN or RAYLESS_TOKEN_FILE (first found wins, in that order).
Without any, the one embedded cluster (``Cluster.local()``) published on this host is used;
an address of a published cluster needs no token (see ``actors.core.published``). The
command joins the cluster as a session of its own, asks the head for its totals (nodes,
CPUs, GPUs, actors) and the first ``--limit`` nodes and live actors (100 by default, as
Ray's ``ray list actors``; 0: all), prints them and ends its session: its cost grows with
the nodes and the limit, not with the actors (``--json`` prints every actor's record under
its node: O(actors)). Ending a session kills only the actors that session spawned, and
this one spawns none, so other drivers' actors are never touched.

Exit codes: 0 on success; 1 with a one-line message on stderr when the address or token is
missing, the head does not answer within ``--timeout`` seconds, or it rejects the token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rayless.actors.core import context, published
from rayless.transport.errors import AuthError, RaylessError

if TYPE_CHECKING:
    from rayless.actors.api.cluster import Cluster
    from rayless.actors.protocol.messages import ActorView, ClusterSummary, NodeView

DEFAULT_TIMEOUT = 5.0
DEFAULT_LIMIT = 100


class StatusError(Exception):
    """A failure ``run`` reports as one line and exit code 1."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``rayless status``'s options to ``parser``."""
    add_cluster_arguments(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the head's raw node records, every actor's under its node",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"nodes and actors listed (default {DEFAULT_LIMIT}; 0: all of them)",
    )


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options that name a cluster (``--address``, ``--token[-file]``, ``--timeout``)
    to ``parser``; :func:`resolve` reads them."""
    parser.add_argument(
        "--address",
        help=f"the head's address, HOST:PORT or tcp://HOST:PORT (default: ${context.ENV_ADDRESS},"
        " else the local cluster published on this host)",
    )
    token = parser.add_mutually_exclusive_group()
    token.add_argument(
        "--token", help=f"the cluster token (default: ${context.ENV_TOKEN}); prefer --token-file"
    )
    token.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"a file holding the cluster token (default: ${context.ENV_TOKEN_FILE})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds to wait for the head (default: {DEFAULT_TIMEOUT:g})",
    )


def resolve(args: argparse.Namespace) -> tuple[str, str]:
    """The address and token from the options, else from the environment, else from the
    local cluster published on this host.

    Raises:
        StatusError: no address or no token, a malformed address, an unreadable token file,
            or several published clusters and no address.
    """
    address = getattr(args, "address", None) or os.environ.get(context.ENV_ADDRESS)
    try:
        if address:
            address = context.normalize_address(address)
    except ValueError as exc:
        raise StatusError(str(exc)) from None
    try:
        if getattr(args, "token", None):
            token: str | None = str(args.token).strip()
        elif getattr(args, "token_file", None):
            token = context.read_token_file(args.token_file)
        elif os.environ.get(context.ENV_TOKEN):
            token = os.environ[context.ENV_TOKEN].strip()
        elif os.environ.get(context.ENV_TOKEN_FILE):
            token = context.read_token_file(os.environ[context.ENV_TOKEN_FILE])
        else:
            token = None
        if not address and not token:
            entry: published.LocalCluster | None = published.find_one()
        else:
            entry = published.find_address(address) if address and not token else None
        if entry is not None:
            address, token = entry.address, entry.token()
    except RaylessError as exc:
        raise StatusError(str(exc)) from None
    if not address:
        raise StatusError(f"no head address: pass --address or set {context.ENV_ADDRESS}")
    if not token:
        raise StatusError(
            f"no cluster token: pass --token-file (or --token), or set {context.ENV_TOKEN_FILE} "
            f"or {context.ENV_TOKEN}"
        )
    return address, token


@contextlib.asynccontextmanager
async def look(address: str, token: str, timeout: float) -> AsyncIterator[Cluster]:
    """A session of the caller's own on the cluster at ``address`` for one look (it spawns
    nothing, so ending it kills nothing): ``async with look(...) as cluster``. Every wait
    inside should be bounded by ``timeout`` too; a timeout or a refusal in the block is
    reported like one at the connection.

    Raises:
        StatusError: the head did not answer within ``timeout``, rejected the token, or the
            address is malformed; any other RaylessError, named.
    """
    import zmq

    from rayless.actors.api.cluster import connect
    from rayless.actors.api.runtime import close_runtimes

    cluster: Cluster | None = None
    try:
        try:
            cluster = await asyncio.wait_for(connect(address, token=token), timeout)
            yield cluster
        except asyncio.TimeoutError:
            raise StatusError(f"no answer from the head at {address} within {timeout:g}s") from None
        except AuthError:
            raise StatusError(f"the head at {address} rejected the token (wrong token?)") from None
        except zmq.ZMQError as exc:
            raise StatusError(f"cannot connect to {address!r}: {exc}") from None
        except RaylessError as exc:
            raise StatusError(f"{type(exc).__name__} from the head at {address}: {exc}") from None
    finally:
        if cluster is not None:
            try:
                await asyncio.wait_for(cluster.aclose(), timeout)
            except (asyncio.TimeoutError, RaylessError):
                pass
        await close_runtimes()  # a half-started connection, if connect() timed out
        context.set_current(None)


async def fetch(address: str, token: str, timeout: float) -> list[dict[str, Any]]:
    """Join the cluster, ask the head for every node with every actor's record (O(actors):
    ``--json``'s full listing), end the (actor-less) session.

    Raises:
        StatusError: as :func:`look`.
    """
    async with look(address, token, timeout) as cluster:
        return await asyncio.wait_for(cluster.nodes(), timeout)


async def fetch_summary(
    address: str, token: str, timeout: float, limit: int | None
) -> ClusterSummary:
    """Join the cluster, ask the head for its totals and first ``limit`` nodes and actors
    (None: all), end the session: O(nodes + limit) at the head, whatever the actor count.

    Raises:
        StatusError: as :func:`look`.
    """
    async with look(address, token, timeout) as cluster:
        return await asyncio.wait_for(cluster.summary(limit), timeout)


# -- formatting ---------------------------------------------------------------------------


def _num(value: Any) -> str:
    """A resource amount without trailing zeros (1, 0.5, 0.25)."""
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return "?"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned plain-text table: numeric columns right-aligned, the rest left-aligned.

    ``None`` cells print as ``-``. Every row must have as many cells as ``headers``.
    """
    cells = [[str(c) for c in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [
        bool(rows) and all(_is_number(r[i]) for r in rows if r[i] is not None)
        for i in range(len(headers))
    ]
    lines = []
    for r in cells:
        parts = [
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def gpu_shares(node: NodeView) -> str:
    """Each GPU's used share, e.g. ``0:0.5 1:1 2:0``."""
    parts = [f"{gpu.index}:{max(0.0, 1.0 - gpu.free):g}" for gpu in node.gpus]
    return " ".join(parts) or "-"


def format_nodes(nodes: list[NodeView]) -> str:
    """The nodes table."""
    rows = []
    for n in nodes:
        total, free = n.gpus_total, n.gpus_free
        rows.append(
            [
                n.node_id,
                n.ip or "?",
                "yes" if n.alive else "NO",
                f"{_num(n.cpus_used)}/{_num(n.cpus)}",
                f"{free}/{total}" + (" (fake)" if n.fake_gpus and total else ""),
                total - free,
                gpu_shares(n),
                n.num_actors,
            ]
        )
    headers = ["NODE", "IP", "ALIVE", "CPUS USED/TOTAL", "GPUS FREE", "GPUS USED", "USED PER GPU"]
    return table([*headers, "ACTORS"], rows)


def _actor_gpus(actor: dict[str, Any]) -> str:
    shares = actor.get("gpu_shares") or []
    return (
        ",".join(
            f"{i}" if float(s) >= 1.0 else f"{i}({_num(s)})" for i, s in shares if s is not None
        )
        or "-"
    )


def format_actors(actors: Iterable[dict[str, Any]]) -> str:
    """The actors table."""
    rows = []
    for a in actors:
        if not isinstance(a, dict):
            continue
        rows.append(
            [
                a.get("name", "?"),
                a.get("cls", "?"),
                a.get("node_id", "?"),
                _actor_gpus(a),
                _num(a.get("cpus", 0)),
                a.get("state", "?"),
                a.get("pid"),
                f"{a.get('restarts', 0)}/{a.get('max_restarts', 0)}",
            ]
        )
    headers = ["NAME", "CLASS", "NODE", "GPUS", "CPUS", "STATE", "PID", "RESTARTS"]
    return table(headers, rows) if rows else "(no actors)"


def format_died(actors: Iterable[ActorView]) -> str:
    """The table of actors that died for good (newest first): why each one ended."""
    rows = []
    for a in actors:
        death = a.death
        exitcode = None if death is None else death.exitcode
        why = "" if death is None else (death.cause or death.reason)
        rows.append([a.name, a.cls, a.node_id, a.pid, "-" if exitcode is None else exitcode, why])
    return table(["NAME", "CLASS", "NODE", "PID", "EXIT", "WHY"], rows)


def render(summary: ClusterSummary, address: str) -> str:
    """The whole plain-text report."""
    s = summary
    lines = [
        f"cluster {address}: {s.nodes_alive}/{s.nodes} nodes alive, {s.actors} actors, "
        f"GPUs {s.gpus - s.gpus_free}/{s.gpus} in use, CPUs {_num(s.cpus_used)}/{_num(s.cpus)}",
        "",
        "Nodes",
        format_nodes(list(s.node_page)),
    ]
    if s.nodes > len(s.node_page):
        lines.append(f"... and {s.nodes - len(s.node_page)} more nodes (--limit 0 lists them all)")
    lines += ["", "Actors", format_actors(a.as_dict() for a in s.actor_page)]
    if s.actors > len(s.actor_page):
        more = s.actors - len(s.actor_page)
        lines.append(f"... and {more} more actors (--limit 0 lists them all)")
    if s.died:
        lines += ["", "Died (most recent first)", format_died(s.died)]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run ``rayless status``; returns the exit code."""
    timeout = float(getattr(args, "timeout", DEFAULT_TIMEOUT))
    try:
        if not timeout > 0:
            raise StatusError("--timeout must be > 0")
        limit = int(getattr(args, "limit", DEFAULT_LIMIT))
        if limit < 0:
            raise StatusError("--limit must be >= 0")
        address, token = resolve(args)
        if getattr(args, "json", False):
            nodes = asyncio.run(fetch(address, token, timeout))
            print(json.dumps(nodes, indent=2, sort_keys=True, default=str))
            return 0
        summary = asyncio.run(fetch_summary(address, token, timeout, limit or None))
    except StatusError as exc:
        print(f"rayless status: {exc}", file=sys.stderr)
        return 1
    print(render(summary, address))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run as ``python -m rayless.actors.api.status``."""
    parser = argparse.ArgumentParser(prog="rayless status", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""``rayless status``: the cluster report of ``rayless.actors.api.status``, plus, with
``--store NAME`` (repeatable), each named store's units, partitions, consumers and waiting
fetches (``--prometheus``: the whole cluster's metrics in the Prometheus text format instead,
``rayless.observe``: nodes, GPUs, actors, calls per method, every store, weight syncs).

It lives here, not in the actors layer, because the store sits above the actors.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from rayless.actors.api import status as cluster_status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster report's options, ``--store NAME`` and ``--prometheus``."""
    cluster_status.add_arguments(parser)
    parser.add_argument(
        "--store", action="append", metavar="NAME", help="also report this store (repeatable)"
    )
    parser.add_argument(
        "--prometheus",
        action="store_true",
        help="print the whole cluster's metrics (nodes, actors, calls, stores) as Prometheus text",
    )


async def store_metrics(
    address: str, token: str, names: list[str], timeout: float
) -> list[dict[str, Any]]:
    """Each named store's ``Store.metrics()``, asked of its controller and units directly
    (the store's client, and torch with it, is never imported). Raises StatusError."""
    from rayless.store.metrics import collect

    async with cluster_status.look(address, token, timeout) as cluster:
        out = []
        for name in names:
            controller = await asyncio.wait_for(cluster.get_actor(name), timeout)
            units, store_id = await asyncio.wait_for(
                asyncio.gather(controller.units(), controller.store_id()), timeout
            )
            metrics = await asyncio.wait_for(collect(controller, units, store_id, name), timeout)
            out.append(metrics)
        return out


def run(args: argparse.Namespace) -> int:
    """Run ``rayless status``; returns the exit code."""
    names = list(getattr(args, "store", None) or [])
    prom = bool(getattr(args, "prometheus", False))
    if not prom:
        code = cluster_status.run(args)
        if code or not names:
            return code
    if prom:  # the whole cluster: nodes, GPUs, actors, calls, stores, weights
        from rayless.observe import exposition, snapshot

        try:
            address, token = cluster_status.resolve(args)
            snap = asyncio.run(snapshot(address, token, stores=names, timeout=float(args.timeout)))
        except cluster_status.StatusError as exc:
            print(f"rayless status: {exc}", file=sys.stderr)
            return 1
        sys.stdout.write(exposition(snap))
        return 0
    from rayless.store.metrics import prometheus, render_text

    try:
        address, token = cluster_status.resolve(args)
        metrics = asyncio.run(store_metrics(address, token, names, float(args.timeout)))
    except cluster_status.StatusError as exc:
        print(f"rayless status: {exc}", file=sys.stderr)
        return 1
    for m in metrics:
        print(prometheus(m) if prom else "\n" + render_text(m))
    return 0

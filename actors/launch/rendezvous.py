"""A launch's rendezvous with its cluster: rank 0 waits until every rank's node agent joined,
other ranks wait for the head's port; and the request that shuts the cluster down.
"""

from __future__ import annotations

import asyncio
import socket
import time

from rayless.actors.errors import LaunchError
from rayless.actors.launch.config import LaunchConfig
from rayless.actors.launch.procs import NodeProcesses, StopFlag
from rayless.actors.protocol.messages import ListNodes, NodeView, Shutdown
from rayless.actors.protocol.wire import ask
from rayless.transport.errors import RaylessError


async def rendezvous(
    cfg: LaunchConfig, token: str, stop: StopFlag, procs: NodeProcesses
) -> list[NodeView]:
    """Wait until a live node has registered each rank ``0..nnodes-1``; return the nodes.

    Raises:
        LaunchError: timeout (naming the missing ranks), a rank given twice or out of range,
            our head or agent exited, or a stop was requested.
    """
    from rayless.transport.client import Client

    deadline = time.monotonic() + cfg.rdzv_timeout
    async with Client(cfg.address, token=token, name="launch", connect_timeout=30) as client:
        while True:
            procs.check_alive()
            if stop.is_set():
                raise LaunchError(f"stopped during the rendezvous ({stop.reason})")
            views = await ask(client, ListNodes(actors=False), timeout=30)
            nodes = [n for n in views if n.alive]
            ranks: dict[int, str] = {}
            for node in nodes:
                rank = node.rank
                if rank is None:
                    continue
                if not 0 <= rank < cfg.nnodes:
                    raise LaunchError(
                        f"node {node.node_id} joined as rank {rank} of --nnodes {cfg.nnodes}"
                    )
                if rank in ranks:
                    raise LaunchError(f"rank {rank} joined twice ({ranks[rank]}, {node.node_id})")
                ranks[rank] = node.node_id
            missing = sorted(set(range(cfg.nnodes)) - set(ranks))
            if not missing:
                return nodes
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"rendezvous timed out after {cfg.rdzv_timeout:g}s: {len(ranks)} of "
                    f"{cfg.nnodes} nodes joined; missing ranks: {', '.join(map(str, missing))} "
                    f"(start the launch with --node-rank R on each; same --nnodes, "
                    f"--master-addr, --master-port and token; ranks on one host need "
                    f"distinct --node-id)"
                )
            await asyncio.sleep(0.3)


async def request_shutdown(address: str, token: str) -> None:
    """Ask the head to shut the cluster down (agents stop their actors and exit 0)."""
    from rayless.transport.client import Client

    try:
        async with Client(address, token=token, name="launch", connect_timeout=5) as client:
            await ask(client, Shutdown(), timeout=10)
    except RaylessError:
        pass


def wait_for_port(host: str, port: int, timeout: float, stop: StopFlag) -> None:
    """Block until ``host:port`` accepts TCP connections.

    Raises:
        LaunchError: not within ``timeout`` seconds, or a stop was requested.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError as exc:
            err = exc
        if stop.is_set():
            raise LaunchError(f"stopped while waiting for the head ({stop.reason})")
        if time.monotonic() > deadline:
            raise LaunchError(
                f"the head at {host}:{port} did not come up within {timeout:g}s ({err}); "
                "is rank 0 running with the same --master-addr/--master-port?"
            )
        time.sleep(0.5)


__all__ = ["rendezvous", "request_shutdown", "wait_for_port"]

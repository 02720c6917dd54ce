"""Where a launch's processes are found: the address the head binds, this node's id (claimed
on its host) and the address this node advertises to the others.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import sys

from rayless.actors.errors import LaunchError
from rayless.actors.launch.config import LaunchConfig
from rayless.placement.discovery import default_node_id

# -- where the head listens --------------------------------------------------------------


def head_bind_address(master_addr: str, port: int) -> str:
    """The address the head binds: the master address if it is an IP literal or names one
    of this host's non-loopback addresses, else every interface (``0.0.0.0``).

    A hostname that resolves to loopback (Debian maps the host name to 127.0.1.1) binds every
    interface, so other nodes can still reach the head.
    """
    try:
        literal = ipaddress.ip_address(master_addr)
    except ValueError:
        literal = None
    if literal is not None:
        return (
            f"tcp://{master_addr}:{port}" if literal.version == 4 else f"tcp://[{literal}]:{port}"
        )
    try:
        ip = socket.gethostbyname(master_addr)
    except OSError:
        return f"tcp://0.0.0.0:{port}"
    if ipaddress.ip_address(ip).is_loopback:
        return f"tcp://0.0.0.0:{port}"
    try:
        with socket.socket() as sock:
            sock.bind((ip, 0))
    except OSError:  # not an address of this host
        return f"tcp://0.0.0.0:{port}"
    return f"tcp://{ip}:{port}"


# -- this node's id and address ------------------------------------------------------------


def _claim(name: str) -> socket.socket | None:
    """Bind the abstract Unix socket ``name`` (Linux; released when the process dies).

    None when another process holds it. Where abstract sockets do not exist, a dummy that
    claims nothing (the check is skipped).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind("\0" + name)
    except OSError as exc:
        sock.close()
        if sys.platform.startswith("linux") and exc.errno == errno.EADDRINUSE:
            return None
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return sock


def claim_node_id(cfg: LaunchConfig) -> tuple[str, socket.socket]:
    """Choose this launch's node id and hold it on this host until the socket is closed.

    An explicit id (``cfg.node_id``) is kept or refused; a default one (Slurm node name or the
    host's id) that another launch of the same cluster holds on this host becomes
    ``<id>-r<rank>``.

    Raises:
        LaunchError: the id is taken on this host, with what to pass instead.
    """
    key = f"rayless-launch/{cfg.master_addr}:{cfg.master_port}/"
    if cfg.node_id is not None:
        candidates = [cfg.node_id]
    else:
        base = cfg.default_node_id or default_node_id()
        candidates = [base, f"{base}-r{cfg.node_rank}"]
    for node_id in candidates:
        sock = _claim(key + node_id)
        if sock is not None:
            return node_id, sock
    raise LaunchError(
        f"node id {candidates[-1]!r} is already used by another launch of {cfg.address} on "
        f"this host; give each rank on one host its own --node-id (e.g. --node-id "
        f"{candidates[0]}-{cfg.node_rank})"
    )


def ip_towards(host: str, port: int) -> str | None:
    """The local address that routes to ``host`` (a UDP connect: no packet is sent), or None
    where it cannot be had or is loopback (a host name that maps to 127.0.1.1 on the master
    must not make rank 0 advertise loopback)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.connect(sockaddr)
                ip = ipaddress.ip_address(sock.getsockname()[0])
        except (OSError, ValueError):
            continue
        if not ip.is_loopback and not ip.is_unspecified:
            return str(ip)
    return None


__all__ = ["claim_node_id", "head_bind_address", "ip_towards"]

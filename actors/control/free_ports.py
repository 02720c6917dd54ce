"""Ports a node agent hands out for torch.distributed rendezvous (a group's MASTER_PORT).

A port is free when it is handed out and taken later, when rank 0 binds it, so something
else may take it in between. A port that ``bind(0)`` picks lies in the kernel's ephemeral
range (``net.ipv4.ip_local_port_range``), where every outgoing connection and every other
``bind(0)`` on the host draws its port too. On a busy host (two test suites, a shared node)
one of them took the port first: rank 0 failed with EADDRINUSE. :class:`PortPicker` draws
at random from the ports *below* that range instead (10000 up to it), which only an explicit
bind takes, checks each by binding it on every address (so a port another process bound on
any one address is not handed out: rank 0 listens on all of them), and does not hand the
same port out again for a while. Where the range leaves no room below it, it falls back to
``bind(0)``.
"""

from __future__ import annotations

import random
import socket
import time
from collections import OrderedDict

__all__ = ["EPHEMERAL_RANGE", "PortPicker", "ephemeral_range", "free_port"]

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST = 10000  # below: well-known and commonly configured service ports
_TRIES = 64
_REUSE_AFTER_S = 300.0  # a port handed out is not handed out again before this


def ephemeral_range(path: str = EPHEMERAL_RANGE) -> tuple[int, int] | None:
    """The kernel's ephemeral port range (first, last), or None where it cannot be read."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return None
    return (low, high) if 0 < low <= high < 65536 else None


class PortPicker:
    """Picks TCP ports free on this host, outside the ephemeral range (module docstring).

    Args:
        ephemeral: the ephemeral range; by default the kernel's.
        rng: the random source (tests seed one).
    """

    def __init__(
        self, ephemeral: tuple[int, int] | None = None, rng: random.Random | None = None
    ) -> None:
        self.ephemeral = ephemeral if ephemeral is not None else ephemeral_range()
        self._rng = rng or random.Random()
        self._handed: OrderedDict[int, float] = OrderedDict()  # port -> when handed out

    def pick(self) -> int:
        """A port free on every address now, not handed out in the last few minutes.

        Raises:
            OSError: not even ``bind(0)`` found a port.
        """
        now = time.monotonic()
        while self._handed and next(iter(self._handed.values())) < now - _REUSE_AFTER_S:
            self._handed.popitem(last=False)
        below = None if self.ephemeral is None else self.ephemeral[0] - 1
        if below is not None and below - _LOWEST >= _TRIES:
            for _ in range(_TRIES):
                port = self._rng.randint(_LOWEST, below)
                if port not in self._handed and self._free(port):
                    return self._hand(port, now)
        for _ in range(_TRIES):  # no room below the range, or none of it free: the kernel's
            port = self._bound(0)
            if port not in self._handed:
                return self._hand(port, now)
        return self._hand(self._bound(0), now)

    def _hand(self, port: int, now: float) -> int:
        self._handed[port] = now
        return port

    def _free(self, port: int) -> bool:
        try:
            self._bound(port)
        except OSError:
            return False
        return True

    def _bound(self, port: int) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("0.0.0.0", port))  # every address: as rank 0's store listens
            return int(sock.getsockname()[1])


_PICKER: PortPicker | None = None


def free_port() -> int:
    """A port for a rendezvous this process hosts (:meth:`PortPicker.pick` of one picker per
    process): a demo's or a user's own MASTER_PORT.

    Raises:
        OSError: not even ``bind(0)`` found a port.
    """
    global _PICKER
    if _PICKER is None:
        _PICKER = PortPicker()
    return _PICKER.pick()

"""Which local user holds the other end of a loopback TCP connection.

Every process on a host reaches a loopback listener from the same address, so a per-address
cap cannot tell one local user from another. The kernel knows the owner of the client socket:
one ``NETLINK_SOCK_DIAG`` request for that exact socket (``inet_diag``, as ``ss -e`` reads it)
returns its uid. No privilege is needed, and the cost is one netlink round trip, whatever the
number of sockets on the host. Linux only; elsewhere, or for a peer on another host, the answer
is None and callers fall back to the peer's address.
"""

from __future__ import annotations

import ipaddress
import itertools
import socket
import struct

__all__ = ["TcpOwners", "is_loopback"]

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_NLMSG_ERROR = 0x2
_NO_COOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states, then inet_diag_sockid: sport, dport
# (big-endian), src[16], dst[16], if, cookie[2].
_REQ = struct.Struct("=BBBBI")
_SOCKID = struct.Struct("!HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
# inet_diag_msg: family, state, timer, retrans, sockid (48 bytes), expires, rqueue, wqueue, uid.
_UID_OFFSET = 4 + 48 + 12
_REPLY_MIN = _UID_OFFSET + 4


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a numeric address) is a loopback address (127/8, ::1, ::ffff:127/8)."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool((mapped or addr).is_loopback)


class TcpOwners:
    """Looks up the uid that owns the client end of accepted loopback TCP connections.

    Holds one netlink socket (opened on first use); :meth:`close` releases it. Never raises:
    where the kernel does not answer (no netlink, another network namespace, the client gone)
    :meth:`uid` returns None.
    """

    def __init__(self, timeout: float = 0.5) -> None:
        self._timeout = timeout
        self._nl: socket.socket | None = None
        self._broken = False
        self._seq = itertools.count(1)

    def uid(self, conn: socket.socket) -> int | None:
        """The uid owning the other end of ``conn``, an accepted TCP socket; None where it is
        not a loopback peer or the kernel cannot say."""
        if self._broken:
            return None
        try:
            peer = conn.getpeername()
            local = conn.getsockname()
        except OSError:
            return None
        if not is_loopback(str(peer[0])):
            return None
        family = conn.family
        try:
            src = _packed(family, str(peer[0]))
            dst = _packed(family, str(local[0]))
        except (OSError, ValueError):
            return None
        req = _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES)
        req += _SOCKID.pack(int(peer[1]), int(local[1]), src, dst)
        req += _SOCKID_TAIL.pack(0, _NO_COOKIE, _NO_COOKIE)
        seq = next(self._seq)
        msg = _NLMSGHDR.pack(
            _NLMSGHDR.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, seq, 0
        )
        try:
            nl = self._socket()
            nl.send(msg + req)
            while True:
                reply = nl.recv(8192)
                length, kind, _, got_seq, _ = _NLMSGHDR.unpack_from(reply)
                if got_seq == seq:
                    break
        except OSError:
            self.close()
            return None
        body = reply[_NLMSGHDR.size : length]
        if kind == _NLMSG_ERROR or len(body) < _REPLY_MIN:
            return None
        return int(struct.unpack_from("=I", body, _UID_OFFSET)[0])

    def close(self) -> None:
        """Release the netlink socket (a later :meth:`uid` opens a new one)."""
        if self._nl is not None:
            self._nl.close()
            self._nl = None

    def _socket(self) -> socket.socket:
        if self._nl is None:
            af_netlink = getattr(socket, "AF_NETLINK", None)
            if af_netlink is None:
                self._broken = True
                raise OSError("no AF_NETLINK on this platform")
            try:
                nl = socket.socket(
                    af_netlink, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, _NETLINK_SOCK_DIAG
                )
            except OSError:
                self._broken = True
                raise
            nl.settimeout(self._timeout)
            self._nl = nl
        return self._nl


def _packed(family: int, host: str) -> bytes:
    """``host`` as inet_diag's 16-byte address field for ``family``."""
    raw = socket.inet_pton(family, host.split("%", 1)[0])
    return raw.ljust(16, b"\0")

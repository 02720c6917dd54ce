"""Network-namespace "hosts" on a private bridge, for the SSH and Slurm launch tests.

Each host is a network namespace joined by a veth pair to a bridge in a private subnet
(10.231.N.0/24, which exists only inside this sandbox and only on those veths); the bridge's
own address (``.1``) is the root namespace's. Namespaces share the filesystem (so remote sides
use this venv and this checkout) but not the network: no loopback address is shared. A host
may get its own ``/etc/hosts`` (``ip netns exec`` bind-mounts ``/etc/netns/NS/hosts``) and,
through :meth:`Net.exec_argv`, its own host name (a UTS namespace).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

from tests.waiting import eventually_sync


def sh(*args: str) -> None:
    """Run a setup command; raise with its output when it fails."""
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def cannot_make_namespaces() -> str | None:
    """Why network namespaces cannot be had here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    probe = f"rlprobe{os.getpid() % 100000}"
    try:
        sh("ip", "netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot create a network namespace: {exc}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def ns_pids(ns: str) -> set[int]:
    """The processes in network namespace ``ns``."""
    out = subprocess.run(
        ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10
    ).stdout
    return {int(p) for p in out.split()}


_NET_LOCK = (
    "/run/lock/rayless-test-netns.lock"
    if os.path.isdir("/run/lock")
    else "/run/rayless-test-netns.lock"
)


def _free_subnet() -> int:
    """An N in 1..254 such that no interface here has an address in 10.231.N.0/24 (starting
    from one derived from the pid, so that side-by-side processes rarely scan the same N)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    taken = {int(n) for n in re.findall(r"\binet 10\.231\.(\d+)\.", out)}
    start = os.getpid() % 254
    for i in range(254):
        n = 1 + (start + i) % 254
        if n not in taken:
            return n
    raise RuntimeError("every 10.231.N.0/24 is taken on this host")


@dataclass
class Net:
    """A bridge ``<tag>br`` at ``<subnet>.1`` and the namespaces added to it."""

    tag: str
    subnet: str
    names: list[str] = field(default_factory=list)
    addrs: list[str] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=list)
    _up: bool = False

    @classmethod
    def for_test(cls, prefix: str) -> Net:
        """Names that differ per test process (give each test module its own ``prefix``); the
        subnet is chosen by :meth:`up`."""
        return cls(tag=f"{prefix}{os.getpid() % 10000}", subnet="")

    def up(self) -> None:
        """Create the bridge in a 10.231.N.0/24 that no other interface of this host has.

        Test processes run side by side (xdist workers, two suites at once), and two bridges
        in one /24 would route one test's packets to the other's namespaces: the choice and
        the bridge's address are made under a host-wide lock.
        """
        bridge = f"{self.tag}br"
        fd = os.open(_NET_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.subnet = f"10.231.{_free_subnet()}"
            sh("ip", "link", "add", bridge, "type", "bridge")
            self._up = True
            sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", bridge)
        finally:
            os.close(fd)  # releases the lock
        sh("ip", "link", "set", bridge, "up")

    def add(self, hostname: str | None = None) -> str:
        """A new namespace on the bridge (address ``<subnet>.<10 + k>``); returns its name."""
        k = len(self.names)
        ns, addr = f"{self.tag}n{k}", f"{self.subnet}.{10 + k}"
        sh("ip", "netns", "add", ns)
        self.names.append(ns)
        self.addrs.append(addr)
        self.hostnames.append(hostname or ns)
        veth, peer = f"{self.tag}v{k}", f"{self.tag}p{k}"
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", ns)
        sh("ip", "link", "set", veth, "master", f"{self.tag}br", "up")
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", peer)
        sh("ip", "-n", ns, "link", "set", peer, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        return ns

    def write_hosts(self) -> None:
        """Give every namespace an /etc/hosts that names all of them (by host name)."""
        lines = ["127.0.0.1 localhost"]
        lines += [f"{a} {h}" for a, h in zip(self.addrs, self.hostnames, strict=True)]
        for ns in self.names:
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write("\n".join(lines) + "\n")

    def exec_in(self, k: int, argv: list[str]) -> list[str]:
        """``argv`` run in namespace ``k`` under its own host name (a new UTS namespace)."""
        script = 'hostname "$0" && exec "$@"'
        ns = self.names[k]
        return [
            "ip",
            "netns",
            "exec",
            ns,
            "unshare",
            "--uts",
            "sh",
            "-c",
            script,
            self.hostnames[k],
            *argv,
        ]

    def teardown(self) -> None:
        """Kill whatever is left in the namespaces, delete them, the bridge and hosts files."""
        for ns in self.names:
            for pid in ns_pids(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        eventually_sync(lambda: not any(ns_pids(ns) for ns in self.names), timeout=5)
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        if self._up:
            subprocess.run(["ip", "link", "del", f"{self.tag}br"], capture_output=True, timeout=30)

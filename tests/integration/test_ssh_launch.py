"""ssh-launch across real "hosts": network namespaces with their own addresses and sshd.

Each host is a network namespace joined by a veth pair to a bridge in a private subnet
(10.231.N.0/24, which exists only inside this sandbox and only on those veths) and runs an
OpenSSH server with a host key and an authorized key made for the test. The namespaces share
the filesystem, so the remote side uses this venv and this checkout. Skips (with the reason)
only where namespaces, a bridge or sshd cannot be had: not root, no iproute2, no sshd.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
NHOSTS = 2

DRIVER = """
import asyncio, os, sys
import rayless.actors as actors
class Where(actors.Actor):
    def ip(self):
        return os.environ["RAYLESS_NODE_IP"]

async def main(mode):
    cluster = await actors.connect()
    nodes = await cluster.nodes()
    ips = sorted(n["ip"] for n in nodes)
    handles = [await cluster.spawn(Where, node=n["node_id"]) for n in nodes]
    seen = sorted([await h.ip() for h in handles])
    print("NODES", ",".join(ips), "ACTORS", ",".join(seen), flush=True)
    if mode == "sleep":
        print("DRIVER SLEEPING", flush=True)
        await asyncio.sleep(300)
    await cluster.aclose()
    return 0

if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
"""


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@dataclass
class Hosts:
    """The namespaces, their addresses, sshd processes and the client key."""

    tag: str
    subnet: str
    key: Path
    names: list[str] = field(default_factory=list)
    addrs: list[str] = field(default_factory=list)
    sshd: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def ns_pids(self, ns: str) -> set[int]:
        out = subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10
        ).stdout
        return {int(p) for p in out.split()}

    def leftovers(self, timeout: float = 15.0) -> dict[str, list[str]]:
        """Processes other than sshd still in each namespace (waits up to ``timeout``)."""
        import psutil

        sshd_pids = {p.pid for p in self.sshd}
        deadline = time.monotonic() + timeout
        while True:
            left: dict[str, list[str]] = {}
            for ns in self.names:
                for pid in self.ns_pids(ns) - sshd_pids:
                    try:
                        proc = psutil.Process(pid)
                        if proc.status() == psutil.STATUS_ZOMBIE:
                            continue
                        cmd = " ".join(proc.cmdline())
                    except psutil.Error:
                        continue
                    if "sshd" in cmd and "actors" not in cmd:  # a closing ssh session
                        continue
                    left.setdefault(ns, []).append(f"{pid}: {cmd}")
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.3)


def _cannot_make_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    if not os.path.exists(SSHD) or shutil.which("ssh") is None:
        return "OpenSSH (sshd, ssh) is not installed; .ci/run installs openssh-server"
    probe = f"rlprobe{os.getpid() % 100000}"
    try:
        _sh("ip", "netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot create a network namespace: {exc}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def _teardown(hosts: Hosts) -> None:
    for proc in hosts.sshd:
        proc.terminate()
    for proc in hosts.sshd:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for ns in hosts.names:  # anything still inside goes (a failed test's leftovers)
        for pid in hosts.ns_pids(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    subprocess.run(["ip", "link", "del", f"{hosts.tag}br"], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    reason = _cannot_make_namespaces()
    if reason is not None:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("ssh")
    tag = f"rl{os.getpid() % 10000}"
    subnet = f"10.231.{20 + os.getpid() % 200}"
    hosts = Hosts(tag=tag, subnet=subnet, key=tmp / "id")
    try:
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "id"))
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "hostkey"))
        shutil.copy(tmp / "id.pub", tmp / "authorized_keys")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation
        bridge = f"{tag}br"
        _sh("ip", "link", "add", bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{subnet}.1/24", "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        for k in range(NHOSTS):
            ns, addr = f"{tag}n{k}", f"{subnet}.{10 + k}"
            _sh("ip", "netns", "add", ns)
            hosts.names.append(ns)
            _sh("ip", "link", "add", f"{tag}v{k}", "type", "veth", "peer", "name", f"{tag}p{k}")
            _sh("ip", "link", "set", f"{tag}p{k}", "netns", ns)
            _sh("ip", "link", "set", f"{tag}v{k}", "master", bridge, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", f"{tag}p{k}")
            _sh("ip", "-n", ns, "link", "set", f"{tag}p{k}", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            hosts.addrs.append(addr)
            config = tmp / f"sshd_config{k}"
            config.write_text(
                f"ListenAddress {addr}\nHostKey {tmp / 'hostkey'}\n"
                f"AuthorizedKeysFile {tmp / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "PidFile none\nLogLevel ERROR\n"
            )
            cmd = ["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(config)]
            hosts.sshd.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL))
        for addr in hosts.addrs:
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection((addr, 22), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        yield hosts
    finally:
        _teardown(hosts)


def _ssh_launch(
    hosts: Hosts, tmp: Path, targets: list[str], mode: str, **popen: object
) -> subprocess.Popen[str]:
    driver = tmp / "driver.py"
    driver.write_text(DRIVER)
    ssh = (
        f"ssh -i {hosts.key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "-o BatchMode=yes -o LogLevel=ERROR -o ConnectTimeout=3"
    )
    argv = [sys.executable, str(REPO / "scripts" / "ssh_launch.py"), "--hosts", ",".join(targets)]
    argv += ["--ssh-cmd", ssh, "--python", sys.executable, "--workdir", str(REPO)]
    argv += ["--node-timeout", "5", "--rdzv-timeout", "60", "--grace", "5"]
    argv += ["--log-dir", str(tmp / "logs"), "--", str(driver), mode]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )  # type: ignore[call-overload]


def test_ssh_launch_runs_a_driver_across_hosts(hosts: Hosts, tmp_path: Path) -> None:
    proc = _ssh_launch(hosts, tmp_path, [f"root@{a}" for a in hosts.addrs], "done")
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    ips = ",".join(sorted(hosts.addrs))
    # the driver ran on rank 0's host, saw both nodes and an actor on each
    assert f"[root@{hosts.addrs[0]}] NODES {ips} ACTORS {ips}" in out, out
    assert hosts.leftovers() == {}


def test_ctrl_c_stops_every_host(hosts: Hosts, tmp_path: Path) -> None:
    proc = _ssh_launch(hosts, tmp_path, hosts.addrs, "sleep")
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "DRIVER SLEEPING" in line:
            break
    else:
        pytest.fail("the driver never started:\n" + "".join(lines))
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(lines) + out
    assert hosts.leftovers() == {}


def test_an_unreachable_host_fails_the_launch_with_its_name(hosts: Hosts, tmp_path: Path) -> None:
    missing = f"{hosts.subnet}.99"  # nobody has this address
    proc = _ssh_launch(hosts, tmp_path, [hosts.addrs[0], missing], "done")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert f"host {missing} (rank 1): ssh failed" in out, out
    assert hosts.leftovers() == {}

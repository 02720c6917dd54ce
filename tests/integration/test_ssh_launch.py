"""ssh-launch across real "hosts": network namespaces with their own addresses and sshd.

Each host is a network namespace on a private bridge (tests/netns.py) and runs an OpenSSH
server with a host key and an authorized key made for the test. The namespaces share the
filesystem, so the remote side uses this venv and this checkout. Skips (with the reason) only
where namespaces, a bridge or sshd cannot be had: not root, no iproute2, no sshd.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.netns import Net, cannot_make_namespaces, ns_pids, sh
from tests.waiting import eventually_sync, wait_until_sync

# xdist_group: the SSH and Slurm tests build network namespaces and bridges (machine-wide)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.xdist_group("netns"),
]

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


@dataclass
class Hosts:
    """The namespaces, their addresses, sshd processes and the client key."""

    net: Net
    key: Path
    sshd: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def subnet(self) -> str:
        return self.net.subnet

    @property
    def addrs(self) -> list[str]:
        return self.net.addrs

    def leftovers(self, timeout: float = 15.0) -> dict[str, list[str]]:
        """Processes other than sshd still in each namespace (waits up to ``timeout``)."""
        import psutil

        sshd_pids = {p.pid for p in self.sshd}

        def scan() -> dict[str, list[str]]:
            left: dict[str, list[str]] = {}
            for ns in self.net.names:
                for pid in ns_pids(ns) - sshd_pids:
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
            return left

        eventually_sync(lambda: not scan(), timeout=timeout, interval=0.3)
        return scan()


def _accepts(addr: str) -> bool:
    """Whether ``addr``:22 accepts a TCP connection now."""
    try:
        socket.create_connection((addr, 22), timeout=1).close()
    except OSError:
        return False
    return True


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """False while ``proc`` (an sshd) runs; raises once it has exited."""
    if proc.poll() is None:
        return False
    raise RuntimeError(f"sshd exited with {proc.returncode} (its stderr is above)")


def _cannot_run() -> str | None:
    if os.geteuid() == 0 and (not os.path.exists(SSHD) or shutil.which("ssh") is None):
        return "OpenSSH (sshd, ssh) is not installed; .ci/run installs openssh-server"
    return cannot_make_namespaces()


def _teardown(hosts: Hosts) -> None:
    for proc in hosts.sshd:
        proc.terminate()
    for proc in hosts.sshd:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    hosts.net.teardown()  # anything still inside goes (a failed test's leftovers)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    reason = _cannot_run()
    if reason is not None:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("ssh")
    hosts = Hosts(net=Net.for_test("rl"), key=tmp / "id")
    try:
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "id"))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "hostkey"))
        shutil.copy(tmp / "id.pub", tmp / "authorized_keys")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation
        hosts.net.up()
        for k in range(NHOSTS):
            ns = hosts.net.add()
            config = tmp / f"sshd_config{k}"
            config.write_text(
                f"ListenAddress {hosts.addrs[k]}\nHostKey {tmp / 'hostkey'}\n"
                f"AuthorizedKeysFile {tmp / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "PidFile none\nLogLevel ERROR\n"
            )
            cmd = ["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(config)]
            hosts.sshd.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL))
        for addr, proc in zip(hosts.addrs, hosts.sshd, strict=True):
            wait_until_sync(
                lambda addr=addr, proc=proc: _accepts(addr) or _exited(proc),
                timeout=20,
                what=f"sshd at {addr}:22",
                interval=0.1,
            )
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

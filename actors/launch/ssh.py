"""Start rayless on many hosts over SSH: one command runs ``rayless.actors.launch.node`` on each.

    rayless ssh-launch --hosts gpu1,gpu2 -- train.py --lr 1e-4
    python scripts/ssh_launch.py --hostfile hosts.txt --workdir /shared/proj -- train.py

The first host is rank 0 (the head and the driver) and, unless ``--master-addr`` says
otherwise, the address the others reach it at. Each host runs
``cd WORKDIR && PYTHON -m actors.launch --nnodes N --node-rank R ... --token-stdin -- CMD``
through ``--ssh-cmd`` (default ``ssh -o BatchMode=yes``); its output comes back prefixed with
``[host]``. Hosts are named after themselves (node id = host, ``-R`` added to repeats), and a
host given as an IP address is also the node's address; others find theirs by discovery.

Token: taken from ``--token-file``, RAYLESS_TOKEN or RAYLESS_TOKEN_FILE, else generated here.
It is written as the first line of each ssh's stdin and read by ``--token-stdin``, so it never
appears on a command line, in a remote environment or on a remote disk. Stdin then stays open:
when this launcher goes away (Ctrl-C, kill, lost connection) the remote side sees EOF and
stops everything it started on that host.

Exit code: rank 0's (the driver's) once it is done. Any host that cannot be reached or exits
with an error before that stops every host and exits 1 with a message naming it; Ctrl-C stops
every host (a second Ctrl-C stops them at once) and exits 130.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from rayless.actors.core import context
from rayless.actors.launch.node import DEFAULT_PORT
from rayless.actors.launch.procs import LaunchError, StopFlag, exit_code
from rayless.transport.errors import RaylessError
from rayless.transport.protocol import new_token

SSH_FAILED = 255  # what ssh exits with when it cannot connect


@dataclass(frozen=True)
class Host:
    """One line of a hostfile: ``[user@]host [slots=N]``."""

    target: str  # what ssh is given
    slots: int | None = None

    @property
    def addr(self) -> str:
        """The host part, without ``user@``."""
        return self.target.rpartition("@")[2]


def parse_hosts(text: str, *, comma: bool = False) -> list[Host]:
    """Hosts from a hostfile's text (one per line, ``#`` comments, optional ``slots=N``), or
    from a comma-separated list with ``comma=True``.

    Raises:
        LaunchError: no host, or a malformed ``slots``/field.
    """
    lines = text.split(",") if comma else text.splitlines()
    hosts = []
    for raw in lines:
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        slots = None
        for extra in fields[1:]:
            match = re.fullmatch(r"slots=(\d+)", extra)
            if match is None or int(match.group(1)) < 1:
                raise LaunchError(f"bad hostfile field {extra!r} in {raw.strip()!r}")
            slots = int(match.group(1))
        hosts.append(Host(fields[0], slots))
    if not hosts:
        raise LaunchError("no hosts given")
    return hosts


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def node_ids(hosts: list[Host]) -> list[str]:
    """A node id per host: the host name, with ``-RANK`` added where a host repeats."""
    names = [re.sub(r"[^A-Za-z0-9_.-]", "_", h.addr) for h in hosts]
    return [f"{n}-{r}" if names.count(n) > 1 else n for r, n in enumerate(names)]


def remote_command(args: argparse.Namespace, hosts: list[Host], rank: int) -> str:
    """The shell command that runs ``rayless.actors.launch.node`` for ``rank`` on its host."""
    host = hosts[rank]
    master = args.master_addr or hosts[0].addr
    launch = [args.python, "-m", "rayless.actors.launch.node", "--nnodes", str(len(hosts))]
    launch += ["--node-rank", str(rank), "--master-addr", master]
    launch += ["--master-port", str(args.master_port), "--token-stdin"]
    launch += ["--node-id", node_ids(hosts)[rank]]
    if _is_ip(host.addr):
        launch += ["--node-ip", host.addr]
    if host.slots is not None:
        launch += ["--gpus", ",".join(str(i) for i in range(host.slots))]
    if args.fake_gpus is not None:
        launch += ["--fake-gpus", str(args.fake_gpus)]
    for opt in ("rdzv_timeout", "node_timeout", "grace"):
        launch += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
    if args.log_dir:
        launch += ["--log-dir", args.log_dir]
    if args.allow_pickle:
        launch += ["--allow-pickle"]
    launch += ["--", *args.driver]
    quoted = " ".join(shlex.quote(a) for a in launch)
    return f"cd {shlex.quote(args.workdir)} && exec env PYTHONUNBUFFERED=1 {quoted}"


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        return context.read_token_file(os.path.expanduser(args.token_file))
    if os.environ.get(context.ENV_TOKEN):
        return os.environ[context.ENV_TOKEN]
    if os.environ.get(context.ENV_TOKEN_FILE):
        return context.read_token_file(os.environ[context.ENV_TOKEN_FILE])
    return new_token()


class _Remote:
    """One host's ssh process and the thread that prefixes its output."""

    def __init__(self, host: Host, rank: int, argv: list[str], token: str, lock: threading.Lock):
        self.host, self.rank = host, rank
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us only; we decide what ssh gets
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # PIPEs
        try:
            self.proc.stdin.write(token.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:  # ssh already died; its exit code tells why
            pass
        self._lock = lock
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        stdout = self.proc.stdout
        if stdout is None:
            return
        prefix = f"[{self.host.target}] ".encode()
        for line in iter(stdout.readline, b""):
            with self._lock:
                sys.stdout.buffer.write(prefix + line)
                sys.stdout.buffer.flush()

    def close_stdin(self) -> None:
        """EOF on the remote launch's stdin: it stops what it started on that host."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def describe_exit(self, code: int) -> str:
        where = f"host {self.host.target} (rank {self.rank})"
        if code == SSH_FAILED:
            return f"{where}: ssh failed (exit 255): unreachable, or the login was refused"
        return f"{where} exited with code {code}"


def _teardown(remotes: list[_Remote], stop: StopFlag, grace: float) -> None:
    """Close every stdin (remote launches stop), wait, then terminate the ssh processes."""
    for r in remotes:
        r.close_stdin()
    deadline = time.monotonic() + grace
    for r in remotes:
        while r.proc.poll() is None and time.monotonic() < deadline and not stop.hurry:
            time.sleep(0.05)
    for r in remotes:
        if r.proc.poll() is None:
            r.proc.terminate()
    for r in remotes:
        try:
            r.proc.wait(5)
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait()
        r.reader.join(2)
        if r.proc.stdout is not None:
            r.proc.stdout.close()


def _say(message: str) -> None:
    print(f"[rayless ssh-launch] {message}", file=sys.stderr, flush=True)


def ssh_launch(args: argparse.Namespace) -> int:
    """Start the launch on every host and supervise it; returns the exit code (module docs).

    Raises:
        LaunchError: bad hosts or options.
    """
    if args.hostfile:
        with open(os.path.expanduser(args.hostfile)) as f:
            hosts = parse_hosts(f.read())
    else:
        hosts = parse_hosts(args.hosts or "", comma=True)
    if not args.driver:
        raise LaunchError("give the driver command after --")
    ssh = shlex.split(args.ssh_cmd)
    token = _token(args)
    stop = StopFlag()
    stop.install()
    lock = threading.Lock()
    remotes: list[_Remote] = []
    # teardown waits for rank 0's driver grace plus the cluster's shutdown
    grace = 2 * args.grace + 5
    try:
        for rank, host in enumerate(hosts):
            argv = [*ssh, host.target, remote_command(args, hosts, rank)]
            remotes.append(_Remote(host, rank, argv, token, lock))
        while True:
            if stop.is_set():
                _say(f"{stop.reason}: stopping every host")
                _teardown(remotes, stop, grace)
                return 128 + stop.signum
            code = remotes[0].proc.poll()
            if code is not None:
                if code == SSH_FAILED:
                    _say(remotes[0].describe_exit(code))
                _teardown(remotes, stop, grace)
                return 1 if code == SSH_FAILED else exit_code(code)
            for r in remotes[1:]:
                code = r.proc.poll()
                if code is not None and code != 0:
                    _say(f"{r.describe_exit(exit_code(code))}: stopping every host")
                    _teardown(remotes, stop, grace)
                    return 1
            time.sleep(0.1)
    finally:
        for r in remotes:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
        stop.uninstall()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``rayless ssh-launch`` / ``scripts/ssh_launch.py``."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", help="comma-separated hosts; the first is rank 0")
    where.add_argument("--hostfile", help="one host per line, optional slots=N (GPUs)")
    parser.add_argument("--ssh-cmd", default="ssh -o BatchMode=yes", help="ssh and its options")
    parser.add_argument("--python", default=sys.executable, help="python on the remote side")
    parser.add_argument("--workdir", default=os.getcwd(), help="directory on the remote side")
    parser.add_argument("--master-addr", default=None, help="rank 0's address (first host)")
    parser.add_argument("--master-port", type=int, default=DEFAULT_PORT, help="head port")
    parser.add_argument("--token-file", default=None, help="token to use (default: a new one)")
    parser.add_argument("--fake-gpus", type=int, default=None, help="report N fake GPUs")
    parser.add_argument("--rdzv-timeout", type=float, default=300.0, help="seconds to join")
    parser.add_argument("--node-timeout", type=float, default=10.0, help="heartbeat timeout")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
    parser.add_argument("--log-dir", default=None, help="actor logs (remote, per host)")
    parser.add_argument(
        "--allow-pickle", action="store_true", help="every launch's --allow-pickle (see launch)"
    )
    parser.add_argument(
        "driver", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the driver command"
    )


def run(args: argparse.Namespace) -> int:
    """``rayless ssh-launch``."""
    if args.driver[:1] == ["--"]:
        args.driver = args.driver[1:]
    try:
        return ssh_launch(args)
    except (RaylessError, OSError) as exc:
        _say(f"error: {exc}")
        return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scripts/ssh_launch.py`` and ``python -m rayless.actors.launch.ssh``."""
    parser = argparse.ArgumentParser(prog="ssh_launch.py", description="start rayless over SSH")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""Per-node launch, torchrun-style: the same command on every node starts one rayless cluster.

    python scripts/launch.py --nnodes 2 --node-rank 0 --master-addr HOST --master-port 29400 \\
        --token-file ~/.rayless/job.token -- train.py --lr 1e-4

Node rank 0 starts the head on ``--master-addr:--master-port`` and its node agent, waits until
all ``--nnodes`` agents joined (a rendezvous: on timeout the message names the missing ranks),
then runs the driver command with RAYLESS_ADDRESS and RAYLESS_TOKEN in its environment (so
``actors.connect()`` joins), and finally shuts the cluster down; its exit code is the driver's.
Other ranks wait for the head's port, start a node agent that registers its rank, and exit 0
when the head shuts the cluster down (1 when the cluster failed). SIGINT/SIGTERM/SIGHUP on a
rank stop every process of ours on that node; on rank 0 the driver gets the signal first, then
the cluster is shut down (exit 128 + signal). Without a driver command, rank 0 keeps the
cluster up until it is signalled (exit 0).

Defaults come from torchrun's MASTER_ADDR/MASTER_PORT/NODE_RANK/NNODES, else Slurm's (see
:func:`env_defaults`), so ``srun python scripts/launch.py --token-file F -- train.py`` works:
inside an ``srun`` step a launch is one task (rank SLURM_PROCID of SLURM_STEP_NUM_TASKS), the
master is the first host of the step's node list, the node id is the Slurm node name and the
port is ``20000 + SLURM_JOB_ID % 10000``, so two jobs on the same nodes do not clash.

Node ids: ``--node-id`` (or RAYLESS_NODE_ID), else the Slurm node name, else the host's default
id (see ``rayless.placement.discovery``). Every launch claims its node id on its host (an
abstract Unix socket named after the cluster address and the id, gone with the process): a
second launch of the same cluster on one host with a default id takes ``<id>-r<rank>``, one with
an explicit id that is taken fails at once and says what to pass.

Agents advertise ``--node-ip``, else RAYLESS_NODE_IP, else the local address that routes to the
master address (where that is not loopback), else the agent's own default.

Token (never on a command line): ``--token-stdin`` (first line of stdin, used by ssh-launch;
stdin is then watched and EOF stops the node), else ``--token-file F`` (read; if F does not
exist, rank 0 generates a token and writes F with mode 0600, other ranks wait for F — a shared
filesystem), else RAYLESS_TOKEN / RAYLESS_TOKEN_FILE, else rank 0 of a one-node launch
generates one. Head, agents and the driver receive it in their environment only.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import os
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rayless.actors.api import context
from rayless.actors.launch.procs import LaunchError, NodeProcesses, StopFlag, read_stdin_line
from rayless.placement.discovery import default_node_id
from rayless.transport.errors import RaylessError
from rayless.transport.protocol import new_token

DEFAULT_PORT = 29400
# Under Slurm without --master-port / MASTER_PORT: SLURM_PORT_BASE + SLURM_JOB_ID % SLURM_PORT_SPAN
# (20000-29999: below Linux's ephemeral range, 32768-60999, so outgoing connections never hold
# it). Two jobs on the same nodes clash only if their ids are a multiple of 10000 apart.
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 10000


@dataclass
class LaunchConfig:
    """Everything one node's launch needs (see :func:`config_from_args`)."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    command: list[str] = field(default_factory=list)
    node_ip: str | None = None
    node_id: str | None = None  # explicit (--node-id / RAYLESS_NODE_ID): taken → an error
    default_node_id: str | None = None  # from Slurm; else the host's default id
    gpus: str | None = None
    fake_gpus: int | None = None
    token_file: str | None = None
    token_stdin: bool = False
    rdzv_timeout: float = 300.0
    node_timeout: float = 10.0
    grace: float = 10.0
    log_dir: str = "rayless-logs"

    @property
    def address(self) -> str:
        """The head's address as every process connects to it."""
        host = self.master_addr
        if ":" in host and not host.startswith("["):  # an IPv6 literal
            host = f"[{host}]"
        return f"tcp://{host}:{self.master_port}"


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist: ``gpu[07-09,12],cpu1`` → ``gpu07``.

    Raises:
        LaunchError: the list is empty or its brackets do not balance.
    """
    depth, first = 0, ""
    for ch in nodelist.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth < 0 or (ch == "," and depth == 0):
            break
        first += ch
    if depth != 0 or not first:
        raise LaunchError(f"cannot parse SLURM_JOB_NODELIST={nodelist!r}")
    # every bracket group → its first element ("07-09,12" → "07"); zero padding is kept
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], first)


def env_defaults(environ: Mapping[str, str]) -> dict[str, Any]:
    """Defaults for nnodes / node_rank / master_addr / master_port / node_id from the
    environment: torchrun's variables win over Slurm's; anything absent is left out.

    Slurm, inside an ``srun`` step (SLURM_STEP_NUM_TASKS and SLURM_PROCID set): one launch per
    task, so nnodes = SLURM_STEP_NUM_TASKS and rank = SLURM_PROCID (not SLURM_NODEID, which
    repeats when a node runs several tasks); the master is the first host of
    SLURM_STEP_NODELIST (a step may use part of the job's nodes); the node id is
    SLURMD_NODENAME, with ``-<SLURM_LOCALID>`` when the step has more tasks than nodes.
    Outside a step (a batch script, ``salloc``'s shell): SLURM_NNODES, SLURM_NODEID and
    SLURM_JOB_NODELIST. With SLURM_JOB_ID the port is ``20000 + SLURM_JOB_ID % 10000``.

    Raises:
        LaunchError: a variable that is present does not parse.
    """
    out: dict[str, Any] = {}

    def integer(name: str) -> int | None:
        value = environ.get(name, "").strip()
        if not value:
            return None
        try:
            return int(value)
        except ValueError:
            raise LaunchError(f"{name}={value!r} is not an integer") from None

    def text(name: str) -> str:
        return environ.get(name, "").strip()

    in_step = integer("SLURM_STEP_NUM_TASKS") is not None and integer("SLURM_PROCID") is not None
    if in_step:
        slurm_nnodes: tuple[str, ...] = ("SLURM_STEP_NUM_TASKS",)
        slurm_rank: tuple[str, ...] = ("SLURM_PROCID",)
        nodelists: tuple[str, ...] = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    else:
        slurm_nnodes = ("SLURM_NNODES", "SLURM_JOB_NUM_NODES")
        slurm_rank = ("SLURM_NODEID",)
        nodelists = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
    for key, names in (
        ("nnodes", ("NNODES", *slurm_nnodes)),
        ("node_rank", ("NODE_RANK", "GROUP_RANK", *slurm_rank)),
        ("master_port", ("MASTER_PORT",)),
    ):
        for name in names:
            value = integer(name)
            if value is not None:
                out[key] = value
                break
    job = integer("SLURM_JOB_ID")
    if "master_port" not in out and job is not None:
        out["master_port"] = SLURM_PORT_BASE + job % SLURM_PORT_SPAN
    if text("MASTER_ADDR"):
        out["master_addr"] = text("MASTER_ADDR")
    else:
        for name in nodelists:
            if text(name):
                out["master_addr"] = first_slurm_host(text(name))
                break
    if in_step and text("SLURMD_NODENAME"):
        node_id = text("SLURMD_NODENAME")
        tasks, nodes = integer("SLURM_STEP_NUM_TASKS"), integer("SLURM_STEP_NUM_NODES")
        if nodes is not None and tasks is not None and tasks > nodes:
            node_id += f"-{text('SLURM_LOCALID') or '0'}"
        out["node_id"] = node_id
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``rayless launch`` / ``scripts/launch.py``."""
    parser.add_argument("--nnodes", type=int, default=None, help="nodes (NNODES, SLURM_NNODES)")
    parser.add_argument(
        "--node-rank", type=int, default=None, help="this node's rank (NODE_RANK, SLURM_NODEID)"
    )
    parser.add_argument(
        "--master-addr", default=None, help="rank 0's host (MASTER_ADDR, first SLURM host)"
    )
    parser.add_argument(
        "--master-port",
        type=int,
        default=None,
        help=f"head port (MASTER_PORT; under Slurm 20000 + SLURM_JOB_ID % 10000; {DEFAULT_PORT})",
    )
    parser.add_argument("--token-file", default=None, help="file holding the cluster token")
    parser.add_argument(
        "--token-stdin", action="store_true", help="read the token from stdin; EOF stops"
    )
    parser.add_argument("--node-ip", default=None, help="address other nodes reach this one at")
    parser.add_argument(
        "--node-id", default=None, help="node id (RAYLESS_NODE_ID; Slurm node name; host-based)"
    )
    parser.add_argument("--gpus", default=None, help="GPUs of this node, e.g. 0,1,2,3")
    parser.add_argument("--fake-gpus", type=int, default=None, help="report N fake GPUs")
    parser.add_argument("--rdzv-timeout", type=float, default=300.0, help="seconds to join")
    parser.add_argument("--node-timeout", type=float, default=10.0, help="heartbeat timeout")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
    parser.add_argument("--log-dir", default="rayless-logs", help="actor log files")
    parser.add_argument(
        "driver",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="the driver command (rank 0 runs it; a .py file or -m runs with this python)",
    )


def config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> LaunchConfig:
    """Merge options with the environment's defaults and check them.

    Raises:
        LaunchError: a missing or invalid setting, with what to pass instead.
    """
    env = os.environ if environ is None else environ
    defaults = env_defaults(env)
    nnodes = args.nnodes if args.nnodes is not None else defaults.get("nnodes", 1)
    rank = args.node_rank if args.node_rank is not None else defaults.get("node_rank", 0)
    master = args.master_addr or defaults.get("master_addr")
    port = args.master_port if args.master_port is not None else defaults.get("master_port")
    if nnodes < 1:
        raise LaunchError(f"--nnodes must be >= 1, got {nnodes}")
    if not 0 <= rank < nnodes:
        raise LaunchError(f"--node-rank must be in [0, {nnodes}), got {rank}")
    if master is None:
        if nnodes > 1:
            raise LaunchError("--master-addr (or MASTER_ADDR / SLURM_JOB_NODELIST) is required")
        master = "127.0.0.1"
    port = DEFAULT_PORT if port is None else port
    if not 0 < port < 65536:
        raise LaunchError(f"--master-port must be in [1, 65535], got {port}")
    node_id = args.node_id or env.get(context.ENV_NODE_ID, "").strip() or None
    for name in ("rdzv_timeout", "node_timeout", "grace"):
        if getattr(args, name) <= 0:
            raise LaunchError(f"--{name.replace('_', '-')} must be > 0")
    command = list(args.driver or [])
    if command[:1] == ["--"]:
        command = command[1:]
    return LaunchConfig(
        nnodes=nnodes,
        node_rank=rank,
        master_addr=master,
        master_port=port,
        command=command,
        node_ip=args.node_ip or env.get(context.ENV_NODE_IP) or None,
        node_id=node_id,
        default_node_id=defaults.get("node_id"),
        gpus=args.gpus,
        fake_gpus=args.fake_gpus,
        token_file=args.token_file,
        token_stdin=args.token_stdin,
        rdzv_timeout=args.rdzv_timeout,
        node_timeout=args.node_timeout,
        grace=args.grace,
        log_dir=args.log_dir,
    )


# -- the token ---------------------------------------------------------------------------


def _write_token_file(path: str, token: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".token-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.replace(tmp, path)  # atomic: a waiting rank never reads half a token
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def resolve_token(cfg: LaunchConfig, stop: StopFlag, environ: Mapping[str, str]) -> str:
    """The cluster token by the rules of the module docstring.

    Raises:
        LaunchError: no token can be had (with what to pass), or a token file stays absent.
    """
    if cfg.token_stdin:
        token = read_stdin_line()
        if not token:
            raise LaunchError("--token-stdin: stdin held no token")
        return token
    if cfg.token_file:
        path = os.path.expanduser(cfg.token_file)
        if not os.path.exists(path) and cfg.node_rank == 0:
            _write_token_file(path, new_token())
        deadline = time.monotonic() + cfg.rdzv_timeout
        while not os.path.exists(path):
            if stop.is_set():
                raise LaunchError(f"stopped while waiting for the token file ({stop.reason})")
            if time.monotonic() > deadline:
                raise LaunchError(f"the token file {path} did not appear (rank 0 writes it)")
            time.sleep(0.2)
        return context.read_token_file(path)
    if environ.get(context.ENV_TOKEN):
        return environ[context.ENV_TOKEN]
    if environ.get(context.ENV_TOKEN_FILE):
        return context.read_token_file(environ[context.ENV_TOKEN_FILE])
    if cfg.nnodes == 1:
        return new_token()
    raise LaunchError(
        "a multi-node launch needs a shared token: --token-file F (rank 0 creates F if it is "
        f"missing, on a shared filesystem), {context.ENV_TOKEN_FILE}, or use ssh-launch"
    )


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


# -- rendezvous ---------------------------------------------------------------------------


async def rendezvous(
    cfg: LaunchConfig, token: str, stop: StopFlag, procs: NodeProcesses
) -> list[dict[str, Any]]:
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
            nodes = [n for n in await client.request(("nodes",), timeout=30) if n.get("alive")]
            ranks: dict[int, str] = {}
            for node in nodes:
                rank = node.get("rank")
                if rank is None:
                    continue
                if not 0 <= int(rank) < cfg.nnodes:
                    raise LaunchError(
                        f"node {node['node_id']} joined as rank {rank} of --nnodes {cfg.nnodes}"
                    )
                if int(rank) in ranks:
                    raise LaunchError(
                        f"rank {rank} joined twice ({ranks[int(rank)]}, {node['node_id']})"
                    )
                ranks[int(rank)] = str(node["node_id"])
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
            await client.request(("shutdown",), timeout=10)
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


# -- the two roles --------------------------------------------------------------------------


def _driver_argv(command: list[str]) -> list[str]:
    if command[0].endswith(".py") or command[0] == "-m":
        return [sys.executable, *command]
    return command


def _run_rank0(cfg: LaunchConfig, token: str, stop: StopFlag, procs: NodeProcesses) -> int:
    procs.start_head(head_bind_address(cfg.master_addr, cfg.master_port))
    procs.start_agent()
    asyncio.run(rendezvous(cfg, token, stop, procs))
    print(f"[rayless launch] all {cfg.nnodes} nodes joined {cfg.address}", flush=True)
    if not cfg.command:  # serve until signalled
        while not stop.wait(0.5):
            procs.check_alive()
        return 0
    env = {context.ENV_ADDRESS: cfg.address, context.ENV_TOKEN: token}
    code = procs.run_driver(_driver_argv(cfg.command), env, stdin_free=not cfg.token_stdin)
    if code is None:  # stopped by a signal: the driver had its chance to exit
        return 128 + stop.signum
    return code


def _run_worker(cfg: LaunchConfig, stop: StopFlag, procs: NodeProcesses) -> int:
    host = cfg.master_addr.strip("[]")
    wait_for_port(host, cfg.master_port, cfg.rdzv_timeout, stop)
    procs.start_agent()
    code = procs.wait_agent()
    if code is None:
        return 128 + stop.signum
    if code != 0:
        print(
            f"[rayless launch] rank {cfg.node_rank}: the cluster failed (node agent exit "
            f"code {code}; the head is gone?)",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def launch(cfg: LaunchConfig, environ: Mapping[str, str] | None = None) -> int:
    """Run one node's part of a launch; returns the process exit code (see module docs)."""
    env = dict(os.environ if environ is None else environ)
    stop = StopFlag()
    stop.install()
    procs: NodeProcesses | None = None
    claim: socket.socket | None = None
    try:
        node_id, claim = claim_node_id(cfg)
        cfg = replace(cfg, node_id=node_id)
        if cfg.node_ip is None:
            cfg = replace(cfg, node_ip=ip_towards(cfg.master_addr, cfg.master_port))
        token = resolve_token(cfg, stop, env)
        if cfg.token_stdin:  # stdin stays open: EOF means the SSH launcher is gone
            threading.Thread(target=stop.watch_stdin, daemon=True).start()
        procs = NodeProcesses(cfg, token, stop, env)
        if cfg.node_rank == 0:
            return _run_rank0(cfg, token, stop, procs)
        return _run_worker(cfg, stop, procs)
    except (RaylessError, OSError) as exc:
        if stop.is_set():  # interrupted while starting: say so, exit as the signal asks
            print(f"[rayless launch] rank {cfg.node_rank}: {exc}", file=sys.stderr, flush=True)
            return 128 + stop.signum
        print(f"[rayless launch] rank {cfg.node_rank}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if procs is not None:
            natural = 0.0
            if cfg.node_rank == 0 and procs.head_alive():
                asyncio.run(request_shutdown(cfg.address, procs.token))
                natural = cfg.grace
            procs.stop_all(natural)
        if claim is not None:
            claim.close()
        stop.uninstall()


def run(args: argparse.Namespace) -> int:
    """``rayless launch``: parse-time options → :func:`launch`."""
    try:
        cfg = config_from_args(args)
    except LaunchError as exc:
        print(f"rayless launch: error: {exc}", file=sys.stderr)
        return 2
    return launch(cfg)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scripts/launch.py`` and ``python -m rayless.actors.launch.node``."""
    parser = argparse.ArgumentParser(
        prog="launch.py", description=__doc__.split("\n")[0] if __doc__ else None
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

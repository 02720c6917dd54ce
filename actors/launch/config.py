"""A launch's configuration: ``rayless launch`` options and their defaults from torchrun's,
Kubernetes' and Slurm's environment variables (see ``actors.launch.node`` for the launch as a
whole).

:func:`add_arguments` declares the options, :func:`env_defaults` reads MASTER_ADDR /
MASTER_PORT / NODE_RANK / NNODES, else a Kubernetes job pod's or Slurm's variables, and
:func:`config_from_args` merges and checks them into a :class:`LaunchConfig`.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rayless.actors.core import context
from rayless.actors.errors import LaunchError
from rayless.actors.launch import kubernetes

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
    default_node_id: str | None = None  # from Slurm or the pod's name; else the host's id
    secret_token_file: str | None = None  # a mounted Kubernetes Secret's (kubernetes.py)
    gpus: str | None = None
    fake_gpus: int | None = None
    token_file: str | None = None
    token_stdin: bool = False
    rdzv_timeout: float = 300.0
    node_timeout: float = 10.0
    grace: float = 10.0
    log_dir: str | None = None  # None: a fresh private directory of this launch (node.py)
    allow_pickle: bool = False  # RAYLESS_ALLOW_PICKLE=1 for the processes it starts

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

    In a Kubernetes job's pod, Kubernetes' defaults (``actors.launch.kubernetes``) replace
    Slurm's; torchrun's variables still win.

    Raises:
        LaunchError: a variable that is present does not parse.
    """
    pod = kubernetes.env_defaults(environ)
    if pod:  # a pod is in no Slurm step, whatever its environment says
        environ = {k: v for k, v in environ.items() if not k.startswith("SLURM")}
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
    for key, value in pod.items():
        out.setdefault(key, value)
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
        help=f"head port (MASTER_PORT; under Slurm 20000 + SLURM_JOB_ID %% 10000; {DEFAULT_PORT})",
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
    parser.add_argument(
        "--log-dir",
        default=None,
        help="directory of the actors' log files (default: a fresh private directory "
        "<runtime dir>/logs/launch-*, the runtime dir being $RAYLESS_RUNTIME_DIR, else "
        "$XDG_RUNTIME_DIR/rayless, else /tmp/rayless-<uid>; printed at start, removed at the "
        "end when every log in it is empty)",
    )
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="the cluster-wide pickle opt-in (RAYLESS_ALLOW_PICKLE=1 for every process this "
        "launch starts, the driver's included): values the codec has no record for travel "
        "with cloudpickle, as in Ray; give it to every rank",
    )
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
        secret_token_file=defaults.get("secret_token_file"),
        gpus=args.gpus,
        fake_gpus=args.fake_gpus,
        token_file=args.token_file,
        token_stdin=args.token_stdin,
        rdzv_timeout=args.rdzv_timeout,
        node_timeout=args.node_timeout,
        grace=args.grace,
        log_dir=args.log_dir,
        allow_pickle=bool(getattr(args, "allow_pickle", False)),
    )


__all__ = [
    "DEFAULT_PORT",
    "SLURM_PORT_BASE",
    "SLURM_PORT_SPAN",
    "LaunchConfig",
    "add_arguments",
    "config_from_args",
    "env_defaults",
    "first_slurm_host",
]

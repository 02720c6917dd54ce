"""Per-node launch, torchrun-style: the same command on every node starts one rayless cluster.

    python scripts/launch.py --nnodes 2 --node-rank 0 --master-addr HOST --master-port 29400 \\
        --token-file ~/.rayless/job.token -- train.py --lr 1e-4

Node rank 0 starts the head on ``--master-addr:--master-port`` and its node agent, waits until
all ``--nnodes`` agents joined (a rendezvous: on timeout the message names the missing ranks),
then runs the driver command with RAYLESS_ADDRESS and RAYLESS_TOKEN_FILE in its environment
(so ``actors.connect()`` joins; the file is ``--token-file`` or a 0600 file of this launch,
removed at its end), and finally shuts the cluster down; its exit code is the driver's.
Other ranks wait for the head's port, start a node agent that registers its rank, and exit 0
when the head shuts the cluster down (1 when the cluster failed). SIGINT/SIGTERM/SIGHUP on a
rank stop every process of ours on that node; on rank 0 the driver gets the signal first, then
the cluster is shut down (exit 128 + signal). Without a driver command, rank 0 keeps the
cluster up until it is signalled (exit 128 + signal too).

Actor logs go to ``--log-dir``, else to a fresh private directory of this launch under
``<runtime dir>/logs`` (see ``actors.core.published``), printed at start and removed at the end
when every log in it is empty; nothing is written into the working directory.

Defaults come from torchrun's MASTER_ADDR/MASTER_PORT/NODE_RANK/NNODES, else Slurm's (see
:func:`env_defaults`), so ``srun python scripts/launch.py --token-file F -- train.py`` works:
inside an ``srun`` step a launch is one task (rank SLURM_PROCID of SLURM_STEP_NUM_TASKS), the
master is the first host of the step's node list, the node id is the Slurm node name and the
port is ``20000 + SLURM_JOB_ID % 10000``, so two jobs on the same nodes do not clash.
In a Kubernetes job's pod the defaults come from the pod instead (``actors.launch.kubernetes``:
the completion index, the master's DNS name, the token of a mounted Secret).

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
generates one. Head and agents receive it through an inherited pipe (RAYLESS_TOKEN_FD), the
driver as RAYLESS_TOKEN_FILE: never in an environment, which ``/proc/<pid>/environ`` shows to
every descendant. A RAYLESS_TOKEN given to the launch stays in the launch's own environment
(the user's choice) and is removed from its children's.

This module runs the two roles (:func:`launch`, ``main``); its parts: ``actors.launch.config``
(options, environment defaults, :class:`LaunchConfig`), ``actors.launch.tokens`` (the token),
``actors.launch.addresses`` (head bind address, node id claim, node IP) and
``actors.launch.rendezvous`` (waiting for the ranks and the head, shutdown). Their names stay
importable from here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import replace

from rayless.actors.core import context, published
from rayless.actors.launch.addresses import claim_node_id, head_bind_address, ip_towards
from rayless.actors.launch.config import (
    DEFAULT_PORT,
    SLURM_PORT_BASE,
    SLURM_PORT_SPAN,
    LaunchConfig,
    add_arguments,
    config_from_args,
    env_defaults,
    first_slurm_host,
)
from rayless.actors.launch.procs import LaunchError, NodeProcesses, StopFlag
from rayless.actors.launch.rendezvous import rendezvous, request_shutdown, wait_for_port
from rayless.actors.launch.tokens import DriverTokenFile, resolve_token
from rayless.transport.errors import RaylessError
from rayless.transport.protocol import ENV_ALLOW_PICKLE

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
    if not cfg.command:  # serve until signalled, then exit as the signal asks
        while not stop.wait(0.5):
            procs.check_alive()
        return 128 + stop.signum
    token_file = DriverTokenFile(cfg, token)
    try:
        env = {context.ENV_ADDRESS: cfg.address, context.ENV_TOKEN_FILE: token_file.path}
        code = procs.run_driver(_driver_argv(cfg.command), env, stdin_free=not cfg.token_stdin)
    finally:
        token_file.remove()
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
    if cfg.allow_pickle:  # every process of ours, the driver's too (transport.protocol)
        env[ENV_ALLOW_PICKLE] = "1"
    stop = StopFlag()
    stop.install()
    procs: NodeProcesses | None = None
    claim: socket.socket | None = None
    own_logs = cfg.log_dir is None
    if own_logs:
        cfg = replace(cfg, log_dir=fresh_log_dir(cfg.node_rank))
    print(f"[rayless launch] rank {cfg.node_rank}: actor logs in {cfg.log_dir}", flush=True)
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
        if own_logs and cfg.log_dir is not None:
            remove_if_empty(cfg.log_dir)
        stop.uninstall()


def fresh_log_dir(rank: int) -> str:
    """A new private (0700) directory for this launch's actor logs, under
    ``<runtime dir>/logs`` where that directory is this user's and nobody else can write it,
    else under the system's temporary directory."""
    parent = published.runtime_dir() / "logs"
    trusted = False
    try:
        for path in (parent.parent, parent):
            path.mkdir(mode=0o700, exist_ok=True)
            info = os.lstat(path)
            trusted = (
                stat.S_ISDIR(info.st_mode)
                and info.st_uid == os.getuid()
                and not info.st_mode & 0o022
            )
            if not trusted:
                break
    except OSError:
        trusted = False
    return tempfile.mkdtemp(prefix=f"launch-rank{rank}-", dir=str(parent) if trusted else None)


def remove_if_empty(log_dir: str) -> None:
    """Remove a launch's log directory when no log in it has a byte; else say where it is."""
    try:
        empty = all(
            os.path.getsize(os.path.join(top, name)) == 0
            for top, _, names in os.walk(log_dir)
            for name in names
        )
    except OSError:
        empty = False
    if empty:
        shutil.rmtree(log_dir, ignore_errors=True)
    else:
        print(f"[rayless launch] actor logs kept in {log_dir}", file=sys.stderr, flush=True)


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


# what this module offered before its parts moved out (config, tokens, addresses, rendezvous)
__all__ = [
    "DEFAULT_PORT",
    "SLURM_PORT_BASE",
    "SLURM_PORT_SPAN",
    "LaunchConfig",
    "LaunchError",
    "add_arguments",
    "claim_node_id",
    "config_from_args",
    "env_defaults",
    "first_slurm_host",
    "head_bind_address",
    "ip_towards",
    "launch",
    "main",
    "rendezvous",
    "request_shutdown",
    "resolve_token",
    "run",
    "wait_for_port",
]


if __name__ == "__main__":
    sys.exit(main())

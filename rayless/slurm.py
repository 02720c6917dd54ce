"""``SlurmJob``: a rayless cluster in a Slurm allocation, started and attached from Python.

    async with SlurmJob(nodes=2, sbatch_args=["--gpus-per-node=8", "--time=12:00:00"]) as job:
        cluster = await job.connect()
        ...  # this process is the driver
    # leaving the block (an error or Ctrl-C included) cancels the job

:meth:`SlurmJob.start` writes a batch script that runs ``srun PYTHON -m
rayless.actors.launch.node --token-file F`` with one task per node and no driver command (rank
0 keeps the cluster up), and submits it with ``sbatch --parsable``. :meth:`SlurmJob.wait_ready`
waits until the job's output says that every node joined and returns the head's address, its
host replaced by the Slurm node's ``NodeAddr`` (``scontrol show node``) so that this host
reaches it. The token is new, in a 0600 file of a fresh 0700 directory under ``token_dir``,
which every node must see (the home directory by default), and is removed at the end.
:meth:`SlurmJob.cancel` scancels the job and waits until it has left the queue; the ``with``
blocks and interpreter exit (``atexit``) call it, and it is idempotent.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from rayless.actors.errors import LaunchError
from rayless.transport import owners
from rayless.transport.files import atomic_write
from rayless.transport.protocol import new_token

_JOINED = re.compile(r"all (\d+) nodes joined tcp://(\S+):(\d+)")
# squeue -j reports a job in every state while Slurm remembers it: these are its ends
_ENDED = frozenset(
    [
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    ]
)


class SlurmJob:
    """One rayless cluster as one Slurm batch job (see the module docstring).

    ``sbatch_args`` go to ``sbatch`` (``--partition``, ``--gpus-per-node``, ``--time``...),
    ``launch_args`` to each node's launch (``--gpus``, ``--log-dir``...); ``env`` is the
    environment of the Slurm commands (and so of the job, ``--export=ALL`` being sbatch's
    default); ``output`` is the job's output file, relative to ``workdir``.
    """

    def __init__(
        self,
        nodes: int,
        *,
        sbatch_args: Sequence[str] = (),
        launch_args: Sequence[str] = (),
        python: str = sys.executable,
        workdir: str | os.PathLike[str] | None = None,
        token_dir: str | os.PathLike[str] = "~/.rayless",
        output: str = "rayless-slurm-%j.out",
        name: str = "rayless",
        env: Mapping[str, str] | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        self.nodes = nodes
        self.sbatch_args = list(sbatch_args)
        self.launch_args = list(launch_args)
        self.python = python
        self.workdir = Path(workdir or os.getcwd())
        self.token_dir = Path(os.path.expanduser(token_dir))
        self.output = output
        self.name = name
        self.env = dict(os.environ if env is None else env)
        self.job_id: int | None = None
        self.token = ""
        self.address = ""
        self._private: str | None = None
        self._cancelled = False

    # -- the job ----------------------------------------------------------------------------

    @property
    def output_path(self) -> Path:
        """The job's output file (once submitted)."""
        return self.workdir / self.output.replace("%j", str(self.job_id))

    def script(self, token_file: str) -> str:
        """The batch script: one launch per node, no driver command."""
        launch = [self.python, "-m", "rayless.actors.launch.node", "--token-file", token_file]
        launch += self.launch_args
        return (
            "#!/bin/bash\n"
            f"#SBATCH --nodes={self.nodes}\n"
            "#SBATCH --ntasks-per-node=1\n"
            f"exec srun {shlex.join(launch)}\n"
        )

    def start(self) -> int:
        """Write the token and the script, submit the job; returns its id.

        Raises:
            LaunchError: sbatch failed (its message is in this one), or the job was started.
        """
        if self.job_id is not None:
            raise LaunchError(f"this SlurmJob was started already (job {self.job_id})")
        self.token_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._private = owners.mkdtemp("slurmjob-", str(self.token_dir))  # mode 0700
        token_file = os.path.join(self._private, "token")
        self.token = new_token()
        atomic_write(token_file, self.token + "\n", perms=0o600)
        script = os.path.join(self._private, "job.sbatch")
        atomic_write(script, self.script(token_file), perms=0o700)
        argv = ["sbatch", "--parsable", "-J", self.name, "-o", self.output, *self.sbatch_args]
        result = self._run([*argv, script])
        if result.returncode != 0:
            self._remove_private()
            raise LaunchError(f"sbatch failed ({result.returncode}): {result.stderr.strip()}")
        self.job_id = int(result.stdout.strip().split(";")[0])
        atexit.register(self.cancel)
        return self.job_id

    def poll_ready(self) -> str:
        """The head's address once every node joined, else ''.

        Raises:
            LaunchError: the job is not started, or it left the queue before it was ready
                (with the end of its output).
        """
        if self.address:
            return self.address
        if self.job_id is None:
            raise LaunchError("the SlurmJob is not started")
        try:
            text = self.output_path.read_text(errors="replace")
        except OSError:
            text = ""
        match = _JOINED.search(text)
        if match is not None:
            self.address = f"tcp://{self._node_addr(match.group(2))}:{match.group(3)}"
            return self.address
        if not self._in_queue():
            tail = text[-2000:] or "(no output)"
            raise LaunchError(f"Slurm job {self.job_id} ended before its cluster was up:\n{tail}")
        return ""

    def wait_ready(self, timeout: float = 300.0, interval: float = 0.5) -> str:
        """:meth:`poll_ready` until it has the address.

        Raises:
            LaunchError: see :meth:`poll_ready`, or ``timeout`` seconds passed.
        """
        deadline = time.monotonic() + timeout
        while not self.poll_ready():
            if time.monotonic() > deadline:
                raise LaunchError(f"Slurm job {self.job_id} was not up after {timeout:g}s")
            time.sleep(interval)
        return self.address

    async def wait_ready_async(self, timeout: float = 300.0, interval: float = 0.5) -> str:
        """:meth:`wait_ready` without blocking the event loop."""
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(self.poll_ready):
            if time.monotonic() > deadline:
                raise LaunchError(f"Slurm job {self.job_id} was not up after {timeout:g}s")
            await asyncio.sleep(interval)
        return self.address

    async def connect(self) -> Any:
        """This process joins the job's cluster as a driver: a ``rayless.actors.Cluster``.

        Raises:
            LaunchError: see :meth:`wait_ready`.
            ConnectError, AuthError: as ``actors.connect``.
        """
        from rayless.actors import connect

        return await connect(await self.wait_ready_async(), token=self.token)

    def cancel(self, timeout: float = 60.0) -> None:
        """scancel the job, wait until it left the queue (up to ``timeout`` seconds) and
        remove the token. Idempotent."""
        atexit.unregister(self.cancel)
        if self.job_id is not None and not self._cancelled:
            self._cancelled = True
            self._run(["scancel", str(self.job_id)])
            deadline = time.monotonic() + timeout
            while self._in_queue() and time.monotonic() < deadline:
                time.sleep(0.2)
        self._remove_private()

    # -- context managers -----------------------------------------------------------------

    def __enter__(self) -> SlurmJob:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.cancel()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()

    async def __aenter__(self) -> SlurmJob:
        await asyncio.to_thread(self.start)
        try:
            await self.wait_ready_async()
        except BaseException:
            await asyncio.to_thread(self.cancel)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()  # not in a thread: it must run even while the loop is being cancelled

    # -- helpers --------------------------------------------------------------------------

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=60, env=self.env, cwd=self.workdir
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess(argv, 1, "", str(exc))

    def _in_queue(self) -> bool:
        """Whether the job is pending, running or still ending (COMPLETING)."""
        result = self._run(["squeue", "-h", "-j", str(self.job_id), "-o", "%T"])
        state = result.stdout.strip()
        return result.returncode == 0 and bool(state) and state not in _ENDED

    def _node_addr(self, host: str) -> str:
        """The NodeAddr Slurm has for node ``host`` (``host`` itself when it has none)."""
        result = self._run(["scontrol", "show", "node", host, "-o"])
        match = re.search(r"\bNodeAddr=(\S+)", result.stdout)
        return match.group(1) if result.returncode == 0 and match else host

    def _remove_private(self) -> None:
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None


__all__ = ["SlurmJob"]

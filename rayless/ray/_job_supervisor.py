"""The actor that runs a submitted job's entrypoint (``JobSubmissionClient.submit_job``,
``rayless job submit --no-wait``), as Ray's ``JobSupervisor`` does.

One detached actor per job, named ``_rayless_jobs/<submission id>``: it starts the
entrypoint (one shell command) as its own child in a new process group, in the actor's
working directory (the job's ``working_dir`` extract when it has one), copies the command's
output into a log file and keeps the job's record (status, times, exit code, message). It
outlives its client, the job and the job's end: status and logs stay readable until
``delete_job`` kills it, or the cluster ends.

The entrypoint is a driver of the same cluster: its ``ray.init()`` finds the cluster's
address in RAYLESS_ADDRESS, the token in a 0600 file of the supervisor's private directory
(RAYLESS_TOKEN_FILE), the job's ``runtime_env`` (without its files, which the supervisor
already runs from) in RAYLESS_RAY_JOB_RUNTIME_ENV and the files' packages in
RAYLESS_RAY_PACKAGES, for its own actors and tasks; the job's config as Ray's job manager
gives it (RAY_JOB_CONFIG_JSON_ENV_VAR: the submitted runtime_env and metadata, which verl's
trainer reads). The actor's own variables (RAYLESS_ACTOR_ID, ...) are not passed on.

Stopping (``stop``, a ``delete_job`` of a running job is refused, the actor's teardown at
the cluster's end) sends RAY_JOB_STOP_SIGNAL (SIGTERM, or SIGINT) to the entrypoint's
process group and, after RAY_JOB_STOP_WAIT_TIME_S (3 s), SIGKILL. The entrypoint also gets
SIGTERM from the kernel should the supervisor die (``PR_SET_PDEATHSIG``), and the node
agent, a child subreaper, ends whatever of it was left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from typing import Any

from rayless.actors import Actor
from rayless.actors.ext import ENV_ADDRESS, cluster_token, owned_dir, pdeathsig_hook
from rayless.ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR
from rayless.ray._worker import ENV_JOB_RUNTIME_ENV, ENV_PACKAGES

# the environment of the supervisor that the entrypoint must not take for its own
_ACTOR_ONLY = (
    "RAYLESS_ACTOR_ID",
    "RAYLESS_ACTOR_NAME",
    "RAYLESS_AGENT_ADDRESS",
    "RAYLESS_AGENT_PID",
    "RAYLESS_TOKEN",
    "RAYLESS_TOKEN_FD",
    "RAYLESS_TOKEN_FILE",
    "RAYLESS_DIE_WITH_PARENT",
)
ENV_SUBMISSION_ID = "RAY_JOB_SUBMISSION_ID"
LOG_TAIL_CHARS = 20_000  # of a failed job's log, in its message (as Ray's)
READ_LIMIT = 1 << 20  # bytes a ``read_logs`` call returns at most


class JobSupervisor(Actor):
    """Runs one job's entrypoint and answers for it (see the module's docstring)."""

    def __init__(
        self,
        submission_id: str,
        entrypoint: str,
        job_runtime_env: dict[str, Any],
        packages: str,
        metadata: dict[str, str],
        runtime_env: dict[str, Any],
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
    ) -> None:
        self.record: dict[str, Any] = {
            "type": "SUBMISSION",
            "job_id": None,
            "submission_id": submission_id,
            "driver_info": None,
            "status": "PENDING",
            "entrypoint": entrypoint,
            "message": None,
            "error_type": None,
            "start_time": int(time.time() * 1000),
            "end_time": None,
            "metadata": metadata,
            "runtime_env": runtime_env,
            "entrypoint_num_cpus": entrypoint_num_cpus,
            "entrypoint_num_gpus": entrypoint_num_gpus,
            "driver_node_id": os.environ.get("RAYLESS_NODE_ID"),
            "driver_exit_code": None,
        }
        self._job_runtime_env = job_runtime_env
        self._packages = packages
        self._dir = ""
        self._log_path = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._grew = asyncio.Event()  # set on new output and at the end; replaced once seen
        self._ended = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._stopper: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        """Start the entrypoint (the spawn returns once it runs, or once it failed to)."""
        self._dir = owned_dir("rayless-job-")
        self._log_path = os.path.join(self._dir, "job.log")
        env = self._entrypoint_env()
        log = open(self._log_path, "ab", buffering=0)  # noqa: SIM115 (the runner closes it)
        try:
            self._proc = await asyncio.create_subprocess_shell(
                self.record["entrypoint"],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own group: a stop signals all of it, not us
                preexec_fn=pdeathsig_hook(signal.SIGTERM),  # from the loop's thread: it lives on
            )
        except OSError as exc:
            log.close()
            self._finish("FAILED", f"Job entrypoint command could not start: {exc}", None)
            self.record["error_type"] = "JOB_ENTRYPOINT_COMMAND_START_ERROR"
            return
        self.record["status"] = "RUNNING"
        self.record["driver_info"] = {
            "id": None,
            "node_ip_address": os.environ.get("RAYLESS_NODE_IP", "127.0.0.1"),
            "pid": str(self._proc.pid),
        }
        self._runner = asyncio.get_running_loop().create_task(self._run(self._proc, log))

    def _entrypoint_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _ACTOR_ONLY}
        token_path = os.path.join(self._dir, "token")
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(cluster_token())
        env["RAYLESS_TOKEN_FILE"] = token_path
        env[ENV_ADDRESS] = os.environ.get(ENV_ADDRESS, "")
        env[ENV_JOB_RUNTIME_ENV] = json.dumps(self._job_runtime_env)
        if self._packages:
            env[ENV_PACKAGES] = self._packages
        else:
            env.pop(ENV_PACKAGES, None)
        env[ENV_SUBMISSION_ID] = self.record["submission_id"]
        env[RAY_JOB_CONFIG_JSON_ENV_VAR] = json.dumps(  # as Ray's job manager sets it
            {"runtime_env": self.record["runtime_env"], "metadata": self.record["metadata"]}
        )
        return env

    async def _run(self, proc: asyncio.subprocess.Process, log: Any) -> None:
        assert proc.stdout is not None
        copier = asyncio.get_running_loop().create_task(self._copy(proc.stdout, log))
        try:
            code = await proc.wait()
            try:  # what the command wrote before it ended (a child it left may hold the pipe)
                await asyncio.wait_for(asyncio.shield(copier), 2.0)
            except asyncio.TimeoutError:
                copier.cancel()
        finally:
            log.close()
        if self._stopping:
            self._finish("STOPPED", None, code)
        elif code == 0:
            self._finish("SUCCEEDED", None, code)
        else:
            tail = self._tail()
            message = (
                f"Job entrypoint command failed with exit code {code}, last available logs "
                f"(truncated to 20,000 chars):\n{tail}"
                if tail
                else f"Job entrypoint command failed with exit code {code}. No logs available."
            )
            self.record["error_type"] = "JOB_ENTRYPOINT_COMMAND_ERROR"
            self._finish("FAILED", message, code)

    async def _copy(self, stream: asyncio.StreamReader, log: Any) -> None:
        while chunk := await stream.read(1 << 16):
            log.write(chunk)
            self._wake()

    def _wake(self) -> None:
        self._grew.set()
        self._grew = asyncio.Event()

    def _finish(self, status: str, message: str | None, code: int | None) -> None:
        self.record.update(status=status, end_time=int(time.time() * 1000), driver_exit_code=code)
        if message is not None:
            self.record["message"] = message
        self._ended.set()
        self._wake()

    def _tail(self) -> str:
        try:
            with open(self._log_path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 4 * LOG_TAIL_CHARS))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return text[-LOG_TAIL_CHARS:]

    def info(self) -> dict[str, Any]:
        """The job's record (``JobDetails``'s fields)."""
        return dict(self.record)

    async def read_logs(self, offset: int = 0, wait: float = 0.0) -> dict[str, Any]:
        """The log from byte ``offset`` (at most 1 MiB): ``{"data", "offset", "done"}``;
        ``done`` once the job ended and everything was read. With ``wait`` > 0 and nothing
        new, waits that long for output or the end first."""
        if wait > 0 and self._size() <= offset and not self._ended.is_set():
            try:
                await asyncio.wait_for(self._grew.wait(), wait)
            except asyncio.TimeoutError:
                pass
        data = b""
        if self._log_path:
            try:
                with open(self._log_path, "rb") as f:
                    f.seek(offset)
                    data = f.read(READ_LIMIT)
            except OSError:
                data = b""
        end = offset + len(data)
        return {"data": data, "offset": end, "done": self._ended.is_set() and end >= self._size()}

    def _size(self) -> int:
        try:
            return os.stat(self._log_path).st_size if self._log_path else 0
        except OSError:
            return 0

    async def stop(self) -> bool:
        """Ask the entrypoint to stop (as Ray's ``stop_job``: returns at once); True if it was
        running. The stop signal goes to its group, SIGKILL after the wait time."""
        if self._proc is None or self._ended.is_set():
            return False
        if not self._stopping:
            self._stopping = True
            self._stopper = asyncio.get_running_loop().create_task(self._stop(self._proc))
        return True

    async def wait(self, timeout: float) -> str:
        """The status once the job ended, or after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(asyncio.shield(self._ended.wait()), timeout)
        except asyncio.TimeoutError:
            pass
        return str(self.record["status"])

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        name = os.environ.get("RAY_JOB_STOP_SIGNAL", "SIGTERM")
        sig = signal.SIGINT if name == "SIGINT" else signal.SIGTERM
        _signal_group(proc.pid, sig)
        try:
            wait_s = float(os.environ.get("RAY_JOB_STOP_WAIT_TIME_S", "3"))
        except ValueError:
            wait_s = 3.0
        try:
            await asyncio.wait_for(asyncio.shield(self._ended.wait()), wait_s)
        except asyncio.TimeoutError:
            _signal_group(proc.pid, signal.SIGKILL)
            await self._ended.wait()

    async def forget(self) -> None:
        """Stop a running entrypoint; remove the log and the token file (``delete_job``, and
        the actor's teardown)."""
        if self._proc is not None and not self._ended.is_set():
            await self.stop()
            await self._ended.wait()
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    async def teardown(self) -> None:
        """At a clean stop (the cluster's end): as :meth:`forget`."""
        await self.forget()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the group the new session made: the shell and its children
    except (ProcessLookupError, PermissionError):
        pass

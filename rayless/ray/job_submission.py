"""Ray's ``ray.job_submission`` on rayless: submit a driver command to a running cluster,
follow its logs, read its status, stop and delete it.

``JobSubmissionClient(address)`` joins a rayless cluster (``host:port``; Ray's dashboard
address ``http://...:8265``, ``"auto"`` and None mean RAYLESS_ADDRESS with the token in
RAYLESS_TOKEN_FILE / RAYLESS_TOKEN, else the local cluster published on this host). Each job
runs in a detached supervisor actor (``rayless.ray._job_supervisor``) that starts the
entrypoint, one shell command, in the job's ``working_dir`` (packed and shipped as actors'
are), with its ``env_vars``; the entrypoint's ``ray.init()`` joins the same cluster and gives
its actors and tasks the job's ``runtime_env``. It runs on the head's node (launch rank 0), as
Ray's entrypoints do, unless ``entrypoint_num_cpus`` / ``_num_gpus`` ask for a share: those
are the supervisor's reservation (its GPUs are the entrypoint's CUDA_VISIBLE_DEVICES);
``entrypoint_memory``, ``entrypoint_resources`` and ``entrypoint_label_selector`` are accepted
without an effect. A job's record and log stay until ``delete_job`` or the cluster's end.

The methods are Ray's, with its names, arguments, return values and exceptions
(``RuntimeError`` for an unknown job, a used submission id, deleting a running job;
``ConnectionError`` when there is no cluster to join).
"""

from __future__ import annotations

import asyncio
import codecs
import copy
import secrets
import string
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rayless.actors import Cluster, Template
from rayless.actors.errors import ActorDiedError, ActorNotFoundError, ConnectError, NameTakenError
from rayless.actors.ext import SyncCluster
from rayless.ray._job_supervisor import JobSupervisor
from rayless.ray._worker import encode_packages, parse_runtime_env

__all__ = [
    "DriverInfo",
    "JobDetails",
    "JobErrorType",
    "JobInfo",
    "JobStatus",
    "JobSubmissionClient",
    "JobType",
]

NAMESPACE = "_rayless_jobs"  # supervisors are named ``_rayless_jobs/<submission id>``
_ID_ALPHABET = string.ascii_letters + string.digits


class JobStatus(str, Enum):
    """A job's state (Ray's)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    def __str__(self) -> str:
        return f"{self.value}"

    def is_terminal(self) -> bool:
        """Whether the job has ended (it will not change again)."""
        return self.value in ("STOPPED", "SUCCEEDED", "FAILED")


class JobErrorType(str, Enum):
    """Why a job failed (Ray's; rayless sets the two entrypoint errors)."""

    RUNTIME_ENV_SETUP_FAILURE = "RUNTIME_ENV_SETUP_FAILURE"
    JOB_SUPERVISOR_ACTOR_START_TIMEOUT = "JOB_SUPERVISOR_ACTOR_START_TIMEOUT"
    JOB_SUPERVISOR_ACTOR_START_FAILURE = "JOB_SUPERVISOR_ACTOR_START_FAILURE"
    JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE = "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE"
    JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE = "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE"
    JOB_SUPERVISOR_ACTOR_DIED = "JOB_SUPERVISOR_ACTOR_DIED"
    JOB_ENTRYPOINT_COMMAND_START_ERROR = "JOB_ENTRYPOINT_COMMAND_START_ERROR"
    JOB_ENTRYPOINT_COMMAND_ERROR = "JOB_ENTRYPOINT_COMMAND_ERROR"


class JobType(str, Enum):
    """How a job came to be: rayless knows submitted jobs only."""

    SUBMISSION = "SUBMISSION"
    DRIVER = "DRIVER"


@dataclass
class DriverInfo:
    """The entrypoint's process: its node's IP and its pid (``id`` is None in rayless)."""

    id: str | None
    node_ip_address: str
    pid: str


_MESSAGES = {
    JobStatus.PENDING: "Job has not started yet.",
    JobStatus.RUNNING: "Job is currently running.",
    JobStatus.STOPPED: "Job was intentionally stopped.",
    JobStatus.SUCCEEDED: "Job finished successfully.",
    JobStatus.FAILED: "Job failed.",
}


@dataclass
class JobDetails:
    """A job's record, as ``get_job_info`` and ``list_jobs`` return it (Ray's fields; times
    are Unix milliseconds)."""

    type: JobType
    status: JobStatus
    entrypoint: str
    job_id: str | None = None
    submission_id: str | None = None
    driver_info: DriverInfo | None = None
    message: str | None = None
    error_type: str | None = None
    start_time: int | None = None
    end_time: int | None = None
    metadata: dict[str, str] | None = field(default_factory=dict)
    runtime_env: dict[str, Any] | None = field(default_factory=dict)
    driver_agent_http_address: str | None = None
    driver_node_id: str | None = None
    driver_exit_code: int | None = None
    entrypoint_num_cpus: float | None = None
    entrypoint_num_gpus: float | None = None
    entrypoint_memory: int | None = None
    entrypoint_resources: dict[str, float] | None = None

    def __post_init__(self) -> None:
        self.type = JobType(self.type)
        self.status = JobStatus(self.status)
        if isinstance(self.driver_info, dict):
            self.driver_info = DriverInfo(**self.driver_info)
        if self.message is None:
            self.message = _MESSAGES[self.status]


JobInfo = JobDetails  # Ray's older record of the same fields


class JobSubmissionClient:
    """Submit jobs to a rayless cluster and manage them (Ray's ``JobSubmissionClient``).

    Raises:
        ConnectionError: there is no cluster at ``address`` (or none named or published).
    """

    def __init__(
        self,
        address: str | None = None,
        create_cluster_if_needed: bool = False,
        cookies: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        verify: str | bool | None = True,
    ) -> None:
        join = None if address in (None, "auto") or "://" in str(address) else address
        if address is not None and str(address).startswith("ray://"):
            join = None
        try:
            self._sync: SyncCluster = Cluster.connect_sync(join)
        except (ConnectError, OSError, ValueError) as exc:
            raise ConnectionError(
                f"Failed to connect to a rayless cluster at address: {address or 'auto'} ({exc})"
            ) from None
        self._default_metadata = dict(metadata or {})

    def close(self) -> None:
        """Leave the cluster (its jobs go on). Idempotent."""
        self._sync.close()

    def __enter__(self) -> JobSubmissionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit_job(
        self,
        *,
        entrypoint: str,
        job_id: str | None = None,
        runtime_env: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
        submission_id: str | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        entrypoint_memory: int | None = None,
        entrypoint_resources: dict[str, float] | None = None,
        entrypoint_label_selector: dict[str, str] | None = None,
    ) -> str:
        """Start ``entrypoint`` (a shell command) as a job; its submission id. Returns once
        the entrypoint runs.

        Raises:
            RuntimeError: ``submission_id`` is taken on this cluster, or the supervisor could
                not start (no node can hold ``entrypoint_num_cpus`` / ``_num_gpus``).
            ValueError: an unsupported ``runtime_env`` key, a bad value, a missing path.
        """
        if not isinstance(entrypoint, str) or not entrypoint.strip():
            raise ValueError(f"entrypoint must be a non-empty shell command, got {entrypoint!r}")
        runtime_env = copy.deepcopy(runtime_env or {})
        spec = parse_runtime_env(runtime_env)
        packages = spec.packages()
        sid = (
            submission_id
            or job_id
            or "raysubmit_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(16))
        )
        if self._lookup(sid) is not None:
            raise RuntimeError(
                f"Job with submission_id {sid} already exists. Please use a different "
                "submission_id."
            )
        job_env = {
            k: v
            for k, v in runtime_env.items()
            if k not in ("working_dir", "py_modules", "excludes")
        }
        record_metadata = {**self._default_metadata, **(metadata or {})}
        # as Ray's, the entrypoint runs on the head's node (rank 0) unless it reserves resources
        node = None if entrypoint_num_cpus or entrypoint_num_gpus else self._head_node()
        try:
            self._sync.spawn(
                JobSupervisor,
                sid,
                entrypoint,
                job_env,
                encode_packages(tuple(p.ref for p in packages)),
                record_metadata,
                runtime_env,
                entrypoint_num_cpus,
                entrypoint_num_gpus,
                name=f"{NAMESPACE}/{sid}",
                node=node,
                cpus=float(entrypoint_num_cpus or 0),
                gpus=float(entrypoint_num_gpus or 0),
                env=spec.env,
                detached=True,
                packages=packages,
                template=Template.LIGHT,
            )
        except NameTakenError:  # submitted by another client since the check above
            raise RuntimeError(
                f"Job with submission_id {sid} already exists. Please use a different "
                "submission_id."
            ) from None
        except (ValueError, TypeError):
            raise
        except Exception as exc:  # no node can hold it, the supervisor did not start
            raise RuntimeError(f"Job {sid} could not start: {exc}") from exc
        return sid

    def stop_job(self, job_id: str) -> bool:
        """Ask the job to stop (RAY_JOB_STOP_SIGNAL, SIGTERM by default, to its process group;
        SIGKILL after RAY_JOB_STOP_WAIT_TIME_S, 3 s); True if it was running. Returns at
        once, as Ray's.

        Raises:
            RuntimeError: there is no such job.
        """
        return bool(self._ask(job_id, "stop"))

    def wait_until_ended(self, job_id: str, timeout: float) -> JobStatus:
        """The job's status once it ended, or after ``timeout`` seconds (rayless only: what
        ``rayless job stop`` waits with, where Ray's CLI polls).

        Raises:
            RuntimeError: there is no such job.
        """
        return JobStatus(self._ask(job_id, "wait", timeout, call_timeout=timeout + 30))

    def delete_job(self, job_id: str) -> bool:
        """Forget an ended job: its record and its log; True once deleted.

        Raises:
            RuntimeError: there is no such job, or it has not ended (stop it first).
        """
        handle = self._job(job_id)
        status = JobStatus(self._ask(job_id, "info", handle=handle)["status"])
        if not status.is_terminal():
            raise RuntimeError(
                f"Attempted to delete job with submission_id {job_id}, but it is in a "
                f"non-terminal state {status}. Please stop the job first (ray job stop)."
            )
        self._ask(job_id, "forget", handle=handle)
        return bool(self._sync.kill(handle))

    def get_job_info(self, job_id: str) -> JobDetails:
        """The job's record.

        Raises:
            RuntimeError: there is no such job.
        """
        return JobDetails(**self._ask(job_id, "info"))

    def list_jobs(self) -> list[JobDetails]:
        """Every job this cluster holds, running or ended (and not deleted)."""
        page = self._sync.list_actors(limit=None)
        prefix = f"{NAMESPACE}/"
        jobs = []
        for view in page.actors:
            if view.named and view.name.startswith(prefix):
                try:
                    jobs.append(JobDetails(**self._ask(view.name[len(prefix) :], "info")))
                except RuntimeError:  # deleted (or its supervisor died) since the listing
                    continue
        return sorted(jobs, key=lambda j: j.start_time or 0)

    def get_job_status(self, job_id: str) -> JobStatus:
        """The job's status.

        Raises:
            RuntimeError: there is no such job.
        """
        return JobStatus(self._ask(job_id, "info")["status"])

    def get_job_logs(self, job_id: str) -> str:
        """Everything the entrypoint wrote so far (stdout and stderr, in order).

        Raises:
            RuntimeError: there is no such job.
        """
        handle = self._job(job_id)
        chunks, offset = [], 0
        while True:
            part = self._ask(job_id, "read_logs", offset, handle=handle)
            if not part["data"]:
                break
            chunks.append(part["data"])
            offset = part["offset"]
        return b"".join(chunks).decode(errors="replace")

    async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
        """The log as it is written, chunk by chunk, until the job ended.

        Raises:
            RuntimeError: there is no such job.
        """
        handle = await asyncio.to_thread(self._job, job_id)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        offset = 0
        while True:
            part = await asyncio.to_thread(
                self._ask, job_id, "read_logs", offset, 5.0, handle=handle
            )
            offset = part["offset"]
            text = decoder.decode(part["data"], final=part["done"])
            if text:
                yield text
            if part["done"]:
                return

    def _head_node(self) -> str | None:
        """The live node of the lowest launch rank (a local cluster's first node)."""
        nodes = [n for n in self._sync.node_views() if n.alive]
        nodes.sort(key=lambda n: (n.rank is None, n.rank or 0, n.node_id))
        return nodes[0].node_id if nodes else None

    def _ask(
        self,
        job_id: str,
        method: str,
        *args: Any,
        handle: Any = None,
        call_timeout: float | None = None,
    ) -> Any:
        """Call the job's supervisor.

        Raises:
            RuntimeError: there is no such job, or its supervisor died (Ray's error for an
                unknown job).
        """
        handle = handle if handle is not None else self._job(job_id)
        try:
            return getattr(handle, method).call(*args, timeout=call_timeout)
        except ActorDiedError:
            raise RuntimeError(f"Job {job_id} does not exist.") from None

    def _job(self, job_id: str) -> Any:
        handle = self._lookup(job_id)
        if handle is None:
            raise RuntimeError(f"Job {job_id} does not exist.")
        return handle

    def _lookup(self, job_id: str) -> Any:
        try:
            return self._sync.get_actor(f"{NAMESPACE}/{job_id}")
        except ActorNotFoundError:
            return None

"""``rayless launch`` inside a Kubernetes pod: its defaults from the pod's environment, and the
token of a mounted Secret.

A pod is a launch of a Kubernetes job when the kubelet's ``KUBERNETES_SERVICE_HOST`` and the
Job controller's ``JOB_COMPLETION_INDEX`` (every pod of an Indexed Job, also JobSet's) are set.
The pod template (``rayless k8s manifest`` writes it) adds:

* ``RAYLESS_K8S_NNODES``: the number of launches (pods) of the cluster;
* ``RAYLESS_K8S_RANK_OFFSET`` (default 0): added to the completion index for the node rank
  (a JobSet's workers Job: 1, its leader being rank 0);
* ``RAYLESS_K8S_MASTER``: the stable DNS name of rank 0's pod through the headless Service
  (``<job>-0.<service>``; JobSet: ``<jobset>-leader-0-0.<jobset>``);
* ``RAYLESS_K8S_TOKEN_FILE``: the token's file in the mounted Secret.

The master port is ``20000 + crc32(master name) % 10000``: the same in every pod of a job,
another for another job (pods with ``hostNetwork`` share a node's ports); MASTER_PORT wins. The
node id is the pod's host name (``<job>-<index>``), the same after a restart, so a replacement
pod of a worker registers again under the id of the one it replaces.

A Secret's file is not the user's 0600 file that ``RAYLESS_TOKEN_FILE`` must be: see
:func:`read_secret_token` for what is accepted instead.
"""

from __future__ import annotations

import os
import socket
import stat
import zlib
from collections.abc import Mapping
from typing import Any

from rayless.actors.errors import LaunchError

ENV_NNODES = "RAYLESS_K8S_NNODES"
ENV_RANK_OFFSET = "RAYLESS_K8S_RANK_OFFSET"
ENV_MASTER = "RAYLESS_K8S_MASTER"
ENV_TOKEN_FILE = "RAYLESS_K8S_TOKEN_FILE"
ENV_INDEX = "JOB_COMPLETION_INDEX"  # the Job controller's, in every pod of an Indexed Job
ENV_IN_POD = "KUBERNETES_SERVICE_HOST"  # the kubelet's, in every pod

PORT_BASE = 20000
PORT_SPAN = 10000
MAX_SECRET_BYTES = 1 << 16


def in_job_pod(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` is that of a pod of an Indexed Job (or of a JobSet)."""
    return bool(environ.get(ENV_IN_POD, "").strip() and environ.get(ENV_INDEX, "").strip())


def master_port(master: str) -> int:
    """The head's port of the job whose rank 0 is ``master`` (see the module docstring)."""
    return PORT_BASE + zlib.crc32(master.encode()) % PORT_SPAN


def env_defaults(environ: Mapping[str, str]) -> dict[str, Any]:
    """nnodes / node_rank / master_addr / master_port / node_id / secret_token_file of a
    launch in a job's pod; empty outside one.

    Raises:
        LaunchError: a variable does not parse, or RAYLESS_K8S_NNODES is missing (and
            torchrun's NNODES too).
    """
    if not in_job_pod(environ):
        return {}

    def integer(name: str, default: int | None = None) -> int:
        value = environ.get(name, "").strip()
        if not value:
            if default is None:
                raise LaunchError(
                    f"in a Kubernetes job's pod {name} must be set (rayless k8s manifest sets it)"
                )
            return default
        try:
            return int(value)
        except ValueError:
            raise LaunchError(f"{name}={value!r} is not an integer") from None

    out: dict[str, Any] = {"node_rank": integer(ENV_RANK_OFFSET, 0) + integer(ENV_INDEX)}
    if environ.get(ENV_NNODES, "").strip() or not environ.get("NNODES", "").strip():
        out["nnodes"] = integer(ENV_NNODES)  # torchrun's NNODES may stand in for it
    master = environ.get(ENV_MASTER, "").strip()
    if master:
        out["master_addr"] = master
        out["master_port"] = master_port(master)
    host = (environ.get("HOSTNAME", "").strip() or socket.gethostname()).split(".")[0]
    if host:
        out["node_id"] = host
    if environ.get(ENV_TOKEN_FILE, "").strip():
        out["secret_token_file"] = environ[ENV_TOKEN_FILE].strip()
    return out


def read_secret_token(path: str) -> str:
    """The token in ``path``, a key of a Secret volume as the kubelet mounts it.

    The kubelet writes a Secret's keys as files owned by root with the volume's
    ``defaultMode`` (the manifests ask 0400), group-readable by the pod's ``fsGroup`` when the
    pod sets one (0440), behind its symbolic links (``KEY -> ..data/KEY``, ``..data ->
    ..<timestamp>``). "Only the owner can read it" means here: after following those links,
    which must stay inside the volume's directory, a regular file owned by root or by this
    user, that nobody but its owner may write and nobody outside its group read, and whose
    group, when it may read, is one of this process's groups (the pod's fsGroup).

    Raises:
        LaunchError: the file cannot be read, leaves its directory, is not such a file, is
            larger than 64 KiB or is empty (the message says which).
    """
    volume = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    real = os.path.realpath(path)
    if os.path.commonpath([volume, real]) != volume:
        raise LaunchError(f"the Secret file {path} leads out of its volume (to {real}): refused")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise LaunchError(f"cannot read the Secret file {path}: {exc}") from None
    try:
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        groups = {os.getgid(), *os.getgroups()}
        if not stat.S_ISREG(info.st_mode):
            problem = "is not a regular file"
        elif info.st_uid not in (0, os.getuid()):
            problem = f"belongs to uid {info.st_uid}, neither root nor this user"
        elif mode & 0o027:
            problem = f"can be written or read by others (mode {mode:04o}; mount it 0400)"
        elif mode & 0o040 and info.st_gid not in groups:
            problem = f"can be read by group {info.st_gid}, not one of this process's groups"
        elif info.st_size > MAX_SECRET_BYTES:
            problem = f"is too large ({info.st_size} bytes)"
        else:
            problem = ""
        if problem:
            raise LaunchError(f"the Secret file {path} {problem}: refused")
        token = os.read(fd, MAX_SECRET_BYTES + 1).decode("utf-8", "replace").strip()
    except OSError as exc:
        raise LaunchError(f"cannot read the Secret file {path}: {exc}") from None
    finally:
        os.close(fd)
    if not token:
        raise LaunchError(f"the Secret file {path} is empty")
    return token


__all__ = [
    "ENV_INDEX",
    "ENV_IN_POD",
    "ENV_MASTER",
    "ENV_NNODES",
    "ENV_RANK_OFFSET",
    "ENV_TOKEN_FILE",
    "env_defaults",
    "in_job_pod",
    "master_port",
    "read_secret_token",
]

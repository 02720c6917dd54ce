"""What a process knows about the cluster it belongs to: the head's address and the token.

A driver learns them from ``Cluster.local()`` or ``actors.connect()``; an actor process and a
driver started by ``scripts/launch.py`` learn them from the environment. The variables:

=====================  ============================================================
RAYLESS_ADDRESS        the head's address (``host:port`` or ``tcp://host:port``)
RAYLESS_TOKEN          the cluster token, as a user may give it (or RAYLESS_TOKEN_FILE: a
                       file holding it, mode 0600); the runtime never sets it
RAYLESS_TOKEN_FD       set by the runtime in the processes it starts: an inherited pipe
                       holding the token, read and closed at start (:func:`take_token`)
RAYLESS_ACTOR_ID       set in actor processes: the actor's id
RAYLESS_ACTOR_NAME     set in actor processes: the actor's name
RAYLESS_NODE_ID        set in actor processes: the node the actor runs on
RAYLESS_NODE_IP        the address other nodes use to reach this node
RAYLESS_AGENT_ADDRESS  set in actor processes: the node agent's address
RAYLESS_GPU_IDS        set in actor processes: the GPUs the actor holds (NVML indices,
                       comma-separated; empty for none), as CUDA_VISIBLE_DEVICES is set
                       unless RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES is (below)
=====================  ============================================================

``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` set to anything but the empty string in an
actor's environment (its spawn's, else its node agent's) leaves CUDA_VISIBLE_DEVICES as the
node has it, as Ray does: the actor sees every GPU of its node and picks its own from
RAYLESS_GPU_IDS (``ray.get_gpu_ids()``); verl's, OpenRLHF's and SGLang's rollouts ask for it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from rayless.actors.errors import ConnectError

ENV_ADDRESS = "RAYLESS_ADDRESS"
ENV_TOKEN = "RAYLESS_TOKEN"
ENV_TOKEN_FILE = "RAYLESS_TOKEN_FILE"
ENV_TOKEN_FD = "RAYLESS_TOKEN_FD"
TOKEN_VARIABLES = (ENV_TOKEN, ENV_TOKEN_FILE, ENV_TOKEN_FD)
ENV_ACTOR_ID = "RAYLESS_ACTOR_ID"
ENV_ACTOR_NAME = "RAYLESS_ACTOR_NAME"
ENV_NODE_ID = "RAYLESS_NODE_ID"
ENV_NODE_IP = "RAYLESS_NODE_IP"
ENV_AGENT_ADDRESS = "RAYLESS_AGENT_ADDRESS"
ENV_AGENT_PID = "RAYLESS_AGENT_PID"
ENV_GPU_IDS = "RAYLESS_GPU_IDS"
ENV_NOSET_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def resource_env(
    gpus: str, spec_env: Mapping[str, str], node_env: Mapping[str, str]
) -> dict[str, str]:
    """The variables an actor's GPUs ``gpus`` (CUDA_VISIBLE_DEVICES' form) set in its
    environment, where ``spec_env`` is what its spawn sets and ``node_env`` what it inherits:
    CUDA_VISIBLE_DEVICES and RAYLESS_GPU_IDS, only the latter under
    RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES (see the module docstring)."""
    noset = spec_env.get(ENV_NOSET_VISIBLE_DEVICES, node_env.get(ENV_NOSET_VISIBLE_DEVICES))
    if noset:
        return {ENV_GPU_IDS: gpus}
    return {"CUDA_VISIBLE_DEVICES": gpus, ENV_GPU_IDS: gpus}


@dataclass
class ClusterInfo:
    """How this process reaches its cluster."""

    address: str
    token: str
    session: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    actor_id: str | None = None
    # "env" when read from the environment (a driver of ``rayless launch`` or an actor),
    # "explicit" when Cluster.local()/connect() set it
    source: str = "explicit"


_current: ClusterInfo | None = None

ADDRESS_FORMS = "'host:port', 'tcp://host:port' ('[::1]:port' for IPv6), or 'auto'"
_ADDRESS = re.compile(r"(?:tcp://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")


def normalize_address(address: str) -> str:
    """``address`` as ``tcp://host:port`` (it may omit the ``tcp://``).

    Raises:
        ValueError: anything else (the message names the accepted forms).
    """
    match = _ADDRESS.fullmatch(address.strip()) if isinstance(address, str) else None
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ValueError(f"bad cluster address {address!r}: use {ADDRESS_FORMS}")
    return f"tcp://{match.group(1)}:{int(match.group(2))}"


MAX_PRIVATE_BYTES = 1 << 16


def read_private(
    path: str, what: str, *, secret: bool, dir_fd: int | None = None, shown: str = ""
) -> str:
    """The text of ``path`` (a ``what``: "token file", "cluster entry"), read only if it is a
    regular file owned by this user that nobody else can write (nor read, when ``secret``).

    The checks are made on the opened descriptor (``O_NOFOLLOW``, ``fstat``), so the file
    cannot be swapped between the check and the read; ``dir_fd`` resolves ``path`` relative
    to an already checked directory (``shown``: the full path, for messages).

    Raises:
        ConnectError: it cannot be opened, is a link or not a regular file, belongs to another
            user, has unsafe modes (the message names the path and what is wrong), or is
            larger than 64 KiB.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    name, path = path, shown or path
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConnectError(f"the {what} {path} is a symbolic link: refused") from None
        raise ConnectError(f"cannot read the {what} {path}: {exc}") from None
    try:
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        unsafe = 0o077 if secret else 0o022
        if not stat.S_ISREG(info.st_mode):
            problem = "is not a regular file"
        elif info.st_uid != os.getuid():
            problem = f"belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
        elif mode & unsafe:
            who = "can be read or written" if secret else "can be written"
            problem = f"{who} by other users (mode {mode:04o}; make it {mode & ~unsafe:04o})"
        elif info.st_size > MAX_PRIVATE_BYTES:
            problem = f"is too large ({info.st_size} bytes)"
        else:
            problem = ""
        if problem:
            raise ConnectError(f"the {what} {path} {problem}: refused")
        data = os.read(fd, MAX_PRIVATE_BYTES + 1)
    except OSError as exc:
        raise ConnectError(f"cannot read the {what} {path}: {exc}") from None
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")


def read_token_file(path: str, *, dir_fd: int | None = None, shown: str = "") -> str:
    """The token stored in ``path`` (whitespace stripped): a regular file of this user with
    mode 0600 or stricter (see :func:`read_private`).

    Raises:
        ConnectError: the file cannot be read, is not this user's private file, or is empty.
    """
    token = read_private(path, "token file", secret=True, dir_fd=dir_fd, shown=shown).strip()
    if not token:
        raise ConnectError(f"the token file {shown or path} is empty")
    return token


def token_pipe(token: str) -> int:
    """A pipe's read end holding ``token`` (the write end is closed): pass it to a child with
    ``pass_fds`` and ``RAYLESS_TOKEN_FD``, then close it here. Keeps the token out of the
    child's environment, which ``/proc/<pid>/environ`` shows to its descendants for good.

    Raises:
        ValueError: the token is longer than a pipe holds unread (4096 bytes).
    """
    data = token.encode()
    if len(data) > 4096:  # written before the child reads: must fit the pipe's buffer
        raise ValueError("a cluster token is at most 4096 bytes")
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)
    return read


def without_token(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the token variables (what a child started by the runtime gets)."""
    return {k: v for k, v in environ.items() if k not in TOKEN_VARIABLES}


def take_token() -> str:
    """The token of a process the runtime started, read once at start and removed from
    ``os.environ`` (so nothing this process starts inherits it): from the pipe named by
    RAYLESS_TOKEN_FD (closed once read), else the user's RAYLESS_TOKEN, else the file named by
    RAYLESS_TOKEN_FILE; '' when none is given.

    Raises:
        ConnectError: the descriptor or the file cannot be read, or the file is not private.
    """
    fd_text = os.environ.pop(ENV_TOKEN_FD, "")
    token = os.environ.pop(ENV_TOKEN, "")
    path = os.environ.pop(ENV_TOKEN_FILE, "")
    if fd_text:
        chunks = []
        try:
            fd = int(fd_text)
            while chunk := os.read(fd, 4096):
                chunks.append(chunk)
            os.close(fd)
        except (ValueError, OSError) as exc:
            raise ConnectError(
                f"cannot read the token from {ENV_TOKEN_FD}={fd_text}: {exc}"
            ) from None
        return b"".join(chunks).decode().strip()
    if token:
        return token.strip()
    return read_token_file(path) if path else ""


def env_token() -> str | None:
    """The token the environment gives: RAYLESS_TOKEN, else the file RAYLESS_TOKEN_FILE names.

    Raises:
        ConnectError: the token file cannot be read, or is not private.
    """
    token = os.environ.get(ENV_TOKEN)
    if not token and os.environ.get(ENV_TOKEN_FILE):
        token = read_token_file(os.environ[ENV_TOKEN_FILE])
    return token or None


def from_env() -> ClusterInfo | None:
    """The cluster named by the environment, if any.

    Raises:
        ValueError: RAYLESS_ADDRESS is malformed (the message names the accepted forms).
        ConnectError: the token file cannot be read.
    """
    address = os.environ.get(ENV_ADDRESS)
    token = env_token() if address else None
    if not address or not token:
        return None
    try:
        address = normalize_address(address)
    except ValueError as exc:
        raise ValueError(f"{ENV_ADDRESS}: {exc}") from None
    return ClusterInfo(address, token, actor_id=os.environ.get(ENV_ACTOR_ID), source="env")


def current() -> ClusterInfo:
    """The cluster this process belongs to.

    Raises:
        ConnectError: no cluster was started or joined, and the environment names none.
    """
    global _current
    if _current is None:
        _current = from_env()
    if _current is None:
        raise ConnectError(
            "not connected to a rayless cluster: use actors.Cluster.local() or "
            f"actors.connect(address, token=...), or set {ENV_ADDRESS} and {ENV_TOKEN}"
        )
    return _current


def set_current(info: ClusterInfo | None) -> None:
    """Make ``info`` the cluster of this process (None forgets it)."""
    global _current
    _current = info

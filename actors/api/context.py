"""What a process knows about the cluster it belongs to: the head's address and the token.

A driver learns them from ``Cluster.local()`` or ``actors.connect()``; an actor process and a
driver started by ``scripts/launch.py`` learn them from the environment. The variables:

=====================  ============================================================
RAYLESS_ADDRESS        the head's address (``tcp://host:port``)
RAYLESS_TOKEN          the cluster token (or RAYLESS_TOKEN_FILE: a file holding it)
RAYLESS_ACTOR_ID       set in actor processes: the actor's id
RAYLESS_ACTOR_NAME     set in actor processes: the actor's name
RAYLESS_NODE_ID        set in actor processes: the node the actor runs on
RAYLESS_NODE_IP        the address other nodes use to reach this node
RAYLESS_AGENT_ADDRESS  set in actor processes: the node agent's address
=====================  ============================================================
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

from rayless.actors.errors import ConnectError

ENV_ADDRESS = "RAYLESS_ADDRESS"
ENV_TOKEN = "RAYLESS_TOKEN"
ENV_TOKEN_FILE = "RAYLESS_TOKEN_FILE"
ENV_ACTOR_ID = "RAYLESS_ACTOR_ID"
ENV_ACTOR_NAME = "RAYLESS_ACTOR_NAME"
ENV_NODE_ID = "RAYLESS_NODE_ID"
ENV_NODE_IP = "RAYLESS_NODE_IP"
ENV_AGENT_ADDRESS = "RAYLESS_AGENT_ADDRESS"
ENV_AGENT_PID = "RAYLESS_AGENT_PID"


@dataclass
class ClusterInfo:
    """How this process reaches its cluster."""

    address: str
    token: str
    session: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    actor_id: str | None = None


_current: ClusterInfo | None = None


def read_token_file(path: str) -> str:
    """The token stored in ``path`` (whitespace stripped).

    Raises:
        ConnectError: the file cannot be read or is empty.
    """
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as exc:
        raise ConnectError(f"cannot read the token file {path}: {exc}") from None
    if not token:
        raise ConnectError(f"the token file {path} is empty")
    return token


def from_env() -> ClusterInfo | None:
    """The cluster named by the environment, if any."""
    address = os.environ.get(ENV_ADDRESS)
    token = os.environ.get(ENV_TOKEN)
    if not token and os.environ.get(ENV_TOKEN_FILE):
        token = read_token_file(os.environ[ENV_TOKEN_FILE])
    if not address or not token:
        return None
    return ClusterInfo(address, token, actor_id=os.environ.get(ENV_ACTOR_ID))


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

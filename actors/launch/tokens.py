"""A launch's cluster token: from stdin, a token file (rank 0 writes it when it is missing), the
environment, a mounted Kubernetes Secret, or a fresh one for a one-node launch (the rules are
in ``actors.launch.node``); and the 0600 file that hands it to the driver
(:func:`driver_token_file`).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping

from rayless.actors.core import context
from rayless.actors.errors import LaunchError
from rayless.actors.launch import kubernetes
from rayless.actors.launch.config import LaunchConfig
from rayless.actors.launch.procs import StopFlag, read_stdin_line
from rayless.transport import owners
from rayless.transport.files import atomic_write
from rayless.transport.protocol import new_token


def _write_token_file(path: str, token: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    atomic_write(path, token + "\n", perms=0o600)  # a waiting rank never reads half a token


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
    if cfg.secret_token_file:
        return kubernetes.read_secret_token(cfg.secret_token_file)
    if cfg.nnodes == 1:
        return new_token()
    raise LaunchError(
        "a multi-node launch needs a shared token: --token-file F (rank 0 creates F if it is "
        f"missing, on a shared filesystem), {context.ENV_TOKEN_FILE}, or use ssh-launch"
    )


class DriverTokenFile:
    """The token file a launch names in its driver's RAYLESS_TOKEN_FILE: the launch's own
    ``--token-file`` when it has one, else a 0600 file in a fresh 0700 directory, removed by
    :meth:`remove` (so the token is never in the driver's environment)."""

    def __init__(self, cfg: LaunchConfig, token: str) -> None:
        self._tmpdir: str | None = None
        if cfg.token_file:
            self.path = os.path.abspath(os.path.expanduser(cfg.token_file))
            return
        self._tmpdir = owners.mkdtemp("rayless-launch-")  # mode 0700
        self.path = os.path.join(self._tmpdir, "token")
        _write_token_file(self.path, token)

    def remove(self) -> None:
        """Remove the file if this launch wrote it. Idempotent."""
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None


__all__ = ["DriverTokenFile", "resolve_token"]

"""The Python an actor runs under: a spawn's ``executable`` (Ray's ``runtime_env``
``py_executable``), and the driver's import path the actor gets beside it.

An actor normally runs the node's own interpreter, forked from its template. With an
``executable`` (an interpreter's path, or a command such as ``uv run --extra vllm``, as
NeMo-RL gives its workers' venvs), the node agent starts it as a fresh process of that
command instead, unless the command is the agent's own interpreter (then it forks as usual).
Such an actor keeps the driver's code directories on its import path (the script's
directory, ``PYTHONPATH`` entries) but not the driver's installed packages: it imports its
own interpreter's, rayless among them.
"""

from __future__ import annotations

import os
import shlex
import site
import sys
from collections.abc import Sequence

__all__ = ["code_paths", "parse_executable"]


def parse_executable(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The command of ``value``: a string split as a shell would (no expansion), or a
    sequence of words; ``()``, the node's own interpreter, for None or an empty one (as
    Ray takes an empty ``py_executable``).

    Raises:
        ValueError: it is not a string or a sequence of strings, or its quotes do not close.
    """
    if not value:
        return ()
    if isinstance(value, str):
        try:
            words = tuple(shlex.split(value))
        except ValueError as exc:
            raise ValueError(f"py_executable {value!r}: {exc}") from None
    elif isinstance(value, Sequence) and all(isinstance(w, str) for w in value):
        words = tuple(value)
    else:
        raise ValueError(
            f"py_executable must be a string or a list of strings, got {type(value).__name__}"
        )
    return words


def _installation() -> tuple[str, ...]:
    """The directories of this interpreter's own installation and packages."""
    roots = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # an old virtualenv's site module
        pass
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user:
        roots.add(user)
    return tuple(os.path.abspath(r) for r in roots if r)


def _installed(path: str, roots: tuple[str, ...]) -> bool:
    path = os.path.abspath(path)
    if os.path.basename(path) in ("site-packages", "dist-packages"):
        return True
    return any(path == r or path.startswith(r + os.sep) for r in roots)


def code_paths(executable: tuple[str, ...]) -> tuple[str, ...]:
    """The driver's import path an actor started with ``executable`` gets: all of it for
    the node's own interpreter, else only the entries outside this interpreter's
    installation (another venv imports its own packages, not the driver's)."""
    paths = tuple(p for p in sys.path if p)
    if not executable:
        return paths
    roots = _installation()
    return tuple(p for p in paths if not _installed(p, roots))

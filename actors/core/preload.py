"""Which modules a node's torch fork template imports before it forks actors: the mode
``RAYLESS_ZYGOTE_PRELOAD`` names, read by whoever starts a template (a local cluster, a node's
agent) and by the template itself (``rayless.actors.host.zygote``).

* ``eager`` (the default): torch and tensordict, before the first spawn;
* ``lazy``: the same, after the first spawn was served;
* ``demand``: only what each spawn brings (its actor's module and the class's
  ``template_imports``).
"""

from __future__ import annotations

import os

__all__ = ["ENV_PRELOAD", "PRELOAD_MODES", "preload_mode"]

ENV_PRELOAD = "RAYLESS_ZYGOTE_PRELOAD"
PRELOAD_MODES = ("eager", "lazy", "demand")


def preload_mode(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The torch template's mode named by ``RAYLESS_ZYGOTE_PRELOAD`` (``eager`` when unset).

    Raises:
        ValueError: a mode not in :data:`PRELOAD_MODES`.
    """
    mode = environ.get(ENV_PRELOAD, "") or "eager"
    if mode not in PRELOAD_MODES:
        raise ValueError(f"{ENV_PRELOAD} must be one of {', '.join(PRELOAD_MODES)}, got {mode!r}")
    return mode

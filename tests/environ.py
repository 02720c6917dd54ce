"""The environment of a subprocess that must not find this test's cluster.

Tests that start drivers, CLIs or launches in a "fresh" environment drop every ``RAYLESS_``
variable (address, token, runtime directory) but the suite's own settings (:data:`KEPT`): the
fork template's mode that conftest sets for every cluster the suite starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

KEPT = ("RAYLESS_ZYGOTE_PRELOAD",)


def without_rayless(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``environ`` without its ``RAYLESS_`` variables, but for :data:`KEPT`."""
    return {k: v for k, v in environ.items() if not k.startswith("RAYLESS_") or k in KEPT}

"""A second Python environment for tests of an actor's ``py_executable``: a real venv
(``python -m venv``, no pip), whose interpreter imports this one's packages (rayless, and
Ray where installed) through a ``.pth`` file, or, ``bare``, nothing beyond the standard
library."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig


def make_venv(path: str, *, bare: bool = False) -> str:
    """Create a venv at ``path``; returns its ``python``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True, timeout=120)
    python = os.path.join(path, "bin", "python")
    if not bare:
        purelib = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
        ours = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
        if site.ENABLE_USER_SITE:
            ours.append(site.getusersitepackages())
        lines = [f"import site; site.addsitedir({d!r})" for d in dict.fromkeys(ours)]
        with open(os.path.join(purelib, "zz_outer.pth"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return python

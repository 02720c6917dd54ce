"""Actor classes for tests/integration/test_death_causes.py: processes that end badly.

``Boom``'s module raises at import when the file named by ``BOOM_FILE`` (an environment
variable of its process) exists: the test creates it between the first start and a restart.
"""

from __future__ import annotations

import os
import sys

_flag = os.environ.get("BOOM_FILE")
if _flag and os.path.exists(_flag):
    print("importing death_classes with the boom file present", flush=True)
    raise RuntimeError(f"boom at import ({_flag} exists)")


class Dies:
    """Prints numbered lines, then ends the way a method asks."""

    def pid(self) -> int:
        return os.getpid()

    def chatter(self, n: int) -> None:
        for i in range(n):
            print(f"line {i} of {n}", flush=True)
        print("a line on stderr", file=sys.stderr, flush=True)

    def exit_with(self, code: int) -> None:
        print(f"about to os._exit({code})", flush=True)
        os._exit(code)
